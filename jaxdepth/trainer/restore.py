"""Reading a checkpoint back (checkpoint.py writes it): the state in its saved layout, the
data iterators' states and the config, each verified against the fingerprints saved with it;
the newest readable checkpoint, an unreadable one moved aside by the trainer (never deleted)
or skipped by readers (eval.py, task.init_from); a resume refused when the config would change
the model, the data or the optimizer."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import equinox as eqx
import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from ..config import Config, ConfigError, MeshConfig, resumable_fields
from ..errors import UserError, one_line, warn
from ..models.trial_axis import shared_spec
from .checkpoint import (CONFIG_KEY, OneTrial, Stacked, config_digest, data_key, layouts,
                         mismatches, open_manager, sha256_hex)
from ..optim import make_optimizer
from .processes import barrier
from .sharding import make_mesh
from .state import TrainState, state_shardings


CORRUPT_DIR = "checkpoints-corrupt"


class NoReadableCheckpoint(UserError):
    """Every checkpoint of the run (or the one asked for) fails to read back."""


class CorruptCheckpoint(Exception):
    """A checkpoint whose arrays, data-iterator state or config read back differ from the
    fingerprints saved with them."""


def from_layout(saved, abstract: TrainState, shardings: TrainState) -> TrainState:
    """The state a checkpoint's `saved` layout holds, placed with `shardings`."""
    if isinstance(saved, Stacked):
        return TrainState(saved.state.step, saved.state.model, saved.state.opt_state,
                          saved.state.key, saved.hparams, saved.frozen, saved.shared)
    model, shared = saved.model, None
    if abstract.shared is not None:
        shared, model = eqx.partition(model, shared_spec(abstract.shared))

    @eqx.filter_jit(donate="all")
    def expand(one, shared):
        own = jax.tree.map(lambda x: x[None], one)
        return eqx.filter_shard(TrainState(own.step, own.model, own.opt_state, own.key, {},
                                           jax.numpy.zeros(1, bool), shared), shardings)

    return expand(OneTrial(saved.step, model, saved.opt_state, saved.key), shared)


def data_states(saved, k: int) -> list:
    """Each of the K trials' data-iterator state, from what read_data_state read."""
    if k == 1:
        return [saved]
    held = saved.get("trials") if isinstance(saved, dict) else None
    if not isinstance(held, list) or len(held) != k:
        raise ValueError(f"the checkpoint's data state holds "
                         f"{len(held) if isinstance(held, list) else 'no'} trials' "
                         f"iterators, not {k}")
    return held


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_compatible(saved: dict, cfg: Config, where: Path) -> None:
    """Refuse to resume with a config that would change the model, data or optimizer."""
    # A field the saved config lacks was added to the library after the checkpoint was
    # written: it had its default then. Except data.valid_seed: before it, data.grammar_seed
    # seeded the validation split.
    now, before = _flat(cfg.to_dict()), _flat(Config.from_dict(saved).to_dict())
    resumable = resumable_fields()  # declared with each field (config.resumable)
    if "valid_seed" not in saved.get("data", {}):
        before["data.valid_seed"] = before["data.grammar_seed"]
    diff = [k for k in sorted(set(now) | set(before))
            if k not in resumable and now.get(k) != before.get(k) and k != "preset"]
    if diff:
        details = ", ".join(f"{k}: checkpoint {before.get(k)!r} vs now {now.get(k)!r}"
                            for k in diff)
        raise ConfigError(f"{diff[0]}: cannot resume {where} with a different config ({details})")


def saved_record(mngr: ocp.CheckpointManager, step: int) -> dict | None:
    """The fingerprints saved with `step`; None for a checkpoint written before they were."""
    if not (Path(mngr.directory) / str(step) / "fingerprints").is_dir():
        return None
    return mngr.restore(step, args=ocp.args.Composite(
        fingerprints=ocp.args.JsonRestore())).fingerprints


def saved_config(mngr: ocp.CheckpointManager, step: int) -> dict:
    """The config saved with `step`; CorruptCheckpoint if it differs from its fingerprint
    (a checkpoint without one is taken as it is)."""
    config = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
    want = (saved_record(mngr, step) or {}).get(CONFIG_KEY)
    if want is not None and config_digest(config) != want:
        raise CorruptCheckpoint("its config differs from the fingerprint saved with it")
    return config


class _DataState:
    """Takes a checkpoint's data-iterator state in place of an iterator: grain's handler calls
    set_state (with the file's bytes for anything but its own iterators), then start_prefetch,
    which an iterator would answer by reading batches."""

    state = None
    digest = None  # of the file's text

    def set_state(self, state) -> None:
        if isinstance(state, (bytes, str)):
            raw = state.encode() if isinstance(state, str) else state
            self.digest = sha256_hex(raw)
            state = json.loads(raw)
        self.state = state

    def start_prefetch(self) -> None:
        pass


def _saved_processes(mngr: ocp.CheckpointManager, step: int) -> int | None:
    """How many processes wrote `step`'s data-iterator states (None: no state file there)."""
    names = (Path(mngr.directory) / str(step) / "data").glob("process_*-of-*.json")
    counts = {int(n.name[:-len(".json")].rsplit("-of-", 1)[1]) for n in names}
    return max(counts) if counts else None


def _dealt_anew(mngr: ocp.CheckpointManager, step: int, saved: int) -> dict:
    """The data state of a checkpoint written by `saved` processes, for a run of another
    number: every file verified against its digest; when they are all one state (the batches
    are a function of the step: each process reads its rows of the same global batch), every
    process takes it; else (streams, each process with its own cursors) a ConfigError."""
    record = saved_record(mngr, step) or {}
    texts = []
    for i in range(saved):
        key = data_key(i, saved)
        raw = (Path(mngr.directory) / str(step) / key).read_bytes()
        if key in record and sha256_hex(raw) != record[key]:
            raise CorruptCheckpoint(f"the data iterator state in {key} differs from the "
                                    f"fingerprint saved with it")
        texts.append(raw)
    if len(set(texts)) > 1:
        raise ConfigError(f"mesh.num_processes: checkpoint {step} was written by {saved} "
                          f"processes, each reading its own streams of the corpus; this run "
                          f"has {jax.process_count()}, whose streams would start elsewhere: "
                          f"resume it with {saved} processes", field="mesh.num_processes")
    return json.loads(texts[0])


def read_data_state(mngr: ocp.CheckpointManager, step: int) -> dict:
    """The data iterator's state this process saved at `step`, read without touching an
    iterator (set it with ``set_state`` when the batches may be read). CorruptCheckpoint if
    its file differs from the digest saved with it (a checkpoint without one is taken as it
    is). With several processes, each reads its own file and all agree: one whose file cannot
    be read makes the checkpoint unreadable for all of them. A checkpoint written by another
    number of processes is resumed where its state does not depend on the process
    (``_dealt_anew``)."""
    saved = _saved_processes(mngr, step)
    if saved is not None and saved != jax.process_count():
        return _dealt_anew(mngr, step, saved)
    key = data_key(jax.process_index(), jax.process_count())
    failure = None
    try:
        probe = _DataState()
        mngr.restore(step, args=ocp.args.Composite(
            data=grain.checkpoint.CheckpointRestore(probe)))
        want = (saved_record(mngr, step) or {}).get(key)
        if want is not None and probe.digest != want:
            raise CorruptCheckpoint(f"the data iterator state in {key} differs from the "
                                    f"fingerprint saved with it")
    except Exception as e:
        failure = e
    if jax.process_count() > 1:
        failed = np.asarray(multihost_utils.process_allgather(np.int32(failure is not None)))
        first = int(np.argmax(failed))
        if failure is None and failed[first]:
            raise CorruptCheckpoint(f"process {first} cannot read its data iterator state "
                                    f"({data_key(first, jax.process_count())})")
    if failure is not None:
        raise failure
    return probe.state


def restore_state(mngr: ocp.CheckpointManager, step: int, abstract: TrainState,
                  shardings: TrainState) -> TrainState:
    """The state of checkpoint `step` (verified against its fingerprints: CorruptCheckpoint),
    placed with `shardings`. A checkpoint of K > 1 trials written before the shared arrays
    were kept once (jaxdepth up to commit ebc47d7: K stacked copies of a frozen backbone) has
    another tree: it is refused saying so, not converted."""
    layout, placed = layouts(abstract, shardings)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), layout, placed)
    try:
        saved = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target))).state
    except Exception as e:
        # Orbax names the tree that differs; only the layout of `shared` is known to change
        if not isinstance(layout, Stacked) or layout.shared is None \
                or "do not match" not in str(e) or "shared" not in str(e):
            raise
        raise ValueError("written before the trials kept their frozen backbone once (it holds "
                         "a copy per trial): resume or export it with jaxdepth at commit "
                         "ebc47d7 or earlier") from None
    verify(mngr, step, saved)
    return from_layout(saved, abstract, shardings)


def _restore_model(mngr: ocp.CheckpointManager, step: int, abstract_state, shardings):
    """The saved layout with only its model read (every other leaf is left unread, as
    Ellipsis): a reader needs neither the optimizer moments nor their memory."""
    def target(path, a, s):
        if path[0].name != "model":
            return ocp.PLACEHOLDER
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)

    item = jax.tree_util.tree_map_with_path(target, *layouts(abstract_state, shardings))
    args = jax.tree.map(lambda t: t if t is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(
        sharding=t.sharding, global_shape=t.shape, dtype=t.dtype), item,
        is_leaf=lambda t: t is ocp.PLACEHOLDER)
    return mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=item, restore_args=args))).state


def verify(mngr: ocp.CheckpointManager, step: int, state) -> None:
    """Raise CorruptCheckpoint if an array of `state` (restored from `step`) differs from the
    fingerprint saved with it. Checkpoints written before fingerprints were saved are taken
    as they are."""
    saved = saved_record(mngr, step)
    if saved is None:
        return
    bad = mismatches(state, saved)
    if bad:
        raise CorruptCheckpoint(f"{len(bad)} array(s) differ from the fingerprints saved with "
                                f"them, e.g. {bad[0]}")


def unreadable_because(e: Exception) -> str:
    """Why a checkpoint could not be restored, in one short line; re-raises what says nothing
    about the checkpoint (the device running out of memory while restoring it)."""
    if isinstance(e, MemoryError) or "out of memory" in str(e).lower():
        raise e
    while e.__cause__ is not None:  # Orbax wraps TensorStore's error, which names the file
        e = e.__cause__
    text = one_line(e.args[0] if isinstance(e, KeyError) and e.args else e)
    text = text.split(" See full TensorStore details")[0]  # then a dump of the array's spec
    return text if len(text) <= 240 else text[:239] + "…"


def restore_newest(mngr: ocp.CheckpointManager, restore_one, where: Path,
                   step: int | None = None, advice: str = ""):
    """(restore_one(step)'s result, its step, [(skipped newer step, why)]) for the newest
    checkpoint restore_one reads and verifies (only `step` when given). Raises
    NoReadableCheckpoint, ending with `advice`, when none can be read. where: the checkpoint
    directory as messages name it (not Orbax's absolute one)."""
    steps = sorted(mngr.all_steps(), reverse=True) if step is None else [step]
    skipped = []
    for s in steps:
        try:
            return restore_one(s), s, skipped
        except ConfigError:
            raise  # this run's settings cannot resume it: no checkpoint is at fault
        except Exception as e:
            skipped.append((s, unreadable_because(e)))
    what = "; ".join(f"step {s}: {why}" for s, why in skipped)
    raise NoReadableCheckpoint(f"no readable checkpoint in {where} ({what}){advice}") from None


def move_aside(run_dir: Path, step: int) -> Path:
    """Move checkpoints/<step> to checkpoints-corrupt/<step> (a new name if that exists):
    kept for inspection, out of the trainer's way."""
    dest_dir = run_dir / CORRUPT_DIR
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / str(step), 1
    while dest.exists():
        dest, n = dest_dir / f"{step}.{n}", n + 1
    (run_dir / "checkpoints" / str(step)).rename(dest)
    return dest


def check_resume(cfg: Config, mngr: ocp.CheckpointManager, run_dir: Path) -> None:
    """Refuse an impossible resume before touching any file, by the newest checkpoint whose
    config can be read."""
    for latest in sorted(mngr.all_steps(), reverse=True):
        try:
            saved = saved_config(mngr, latest)
        except Exception:  # unreadable: restore_newest says why when it gets there
            continue
        check_compatible(saved, cfg, run_dir)
        if cfg.run.steps < latest:
            raise ConfigError(f"run.steps: {cfg.run.steps} is below step {latest} of the latest "
                              f"checkpoint in {run_dir / 'checkpoints'}; give --run.steps "
                              f"{latest} or more (as many re-evaluates it)", field="run.steps")
        return


def resume(mngr: ocp.CheckpointManager, run_dir: Path, abstract: TrainState, shardings):
    """(the newest readable checkpoint's state, its data iterator's saved state) for the
    trainer to resume from: newer unreadable checkpoints are moved aside (move_aside), each
    with a warning."""
    def restore_one(step: int):
        saved_config(mngr, step)  # a checkpoint is read whole: its config and data
        data_state = read_data_state(mngr, step)  # state too, before anything moves
        return restore_state(mngr, step, abstract, shardings), data_state

    where = run_dir / "checkpoints"  # as the user gave it, not Orbax's absolute path
    (state, data_state), step, skipped = restore_newest(
        mngr, restore_one, where=where,
        advice=f"; move {where} aside (or give another --run.dir) to start afresh")
    if skipped:
        if jax.process_index() == 0:
            for s, why in skipped:
                dest = move_aside(run_dir, s)
                warn(f"checkpoint {s} in {where} is unreadable ({why}); moved to {dest}; "
                     f"resuming from step {step}")
        barrier("checkpoint_fallback")
        mngr.reload()  # forget the steps moved away (the next saves must not touch them)
    return state, data_state


def load_model(run_dir, task_for, step: int | None = None, mesh=None, mesh_cfg=None,
               label: str = "step"):
    """(model, saved Config, step) of a run's checkpoint (latest readable by default), opened
    read-only; an unreadable newer checkpoint is skipped with a warning, never moved.

    task_for(saved config) gives the Task that builds the model. Only the model is restored
    (not the optimizer state), on `mesh` (default: one device) in the layout `mesh_cfg`
    describes (default: data parallel). `label` names the setting that chose the step in
    error messages (e.g. "task.init_step").
    """
    run = Path(run_dir)
    if not (run / "checkpoints").is_dir():
        raise FileNotFoundError(f"no checkpoints in {run} (expected {run / 'checkpoints'})")
    mesh = mesh if mesh is not None else make_mesh(MeshConfig(data=1))
    mngr = open_manager(run, read_only=True)

    def restore_one(s: int):
        cfg = Config.from_dict(saved_config(mngr, s))
        placed = dataclasses.replace(cfg, mesh=mesh_cfg or MeshConfig(data=mesh.shape["data"],
                                                                     model=mesh.shape["model"]))
        tx = make_optimizer(cfg.optim, cfg.run.steps)
        saved = _restore_model(mngr, s, *state_shardings([placed], tx, mesh, task_for(placed)))
        verify(mngr, s, saved)
        return saved.model, cfg

    try:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {run / 'checkpoints'}")
        if step is not None and step not in steps:
            raise ConfigError(f"{label} {step}: not a checkpoint in {run / 'checkpoints'} "
                              f"(available: {steps})", field=label)
        (model, cfg), step, skipped = restore_newest(
            mngr, restore_one, run / "checkpoints", step, advice="" if step is None else
            f"; the other steps there: {[s for s in steps if s != step]}")
    finally:
        mngr.close()
    for s, why in skipped:
        warn(f"checkpoint {s} in {run / 'checkpoints'} is unreadable ({why}); using step {step}")
    return model, cfg, step
