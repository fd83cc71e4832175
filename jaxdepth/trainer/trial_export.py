"""A trial of a run with trials, exported as the single-trial run directory its solo run would
have written: its config, every checkpoint of the run as that trial's own (state, data-iterator
state and fingerprints of the solo layout), its metrics, its summary, its data. What reads a
run (eval.py, task.init_from, the analyses) reads it unchanged, and it resumes as a solo run.

An export goes to the trial's own directory (<run>/trials/<k>, where its evaluations already
are) or to a directory outside the run that is new, empty, or an export of the same trial of
the same run (its marker, .export.json, written before anything else there): rerunning an
interrupted or finished export finishes or refreshes it, keeping the checkpoints and files it
already wrote and writing config.json, metrics.jsonl and summary.json afresh from the run (as
a re-export to <run>/trials/<k> does). Any other directory is refused before anything is
written: the export would mix two runs' files. Of the source run, only <run>/trials/<k> is
written to, and only when it is the destination.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax

from ..config import Config, ConfigError, MeshConfig
from ..config.trials import trial_configs
from ..errors import warn
from ..files import write_whole
from . import checkpoint as ckpt
from . import trials as tr
from .optim import make_optimizer
from .processes import barrier, one_device_each
from .sharding import make_mesh
from .state import state_shardings


class _SavedState:
    """A trial's saved data-iterator state, handed to checkpoint.save in place of the run's
    iterators."""

    def __init__(self, state):
        self.state = state

    def states(self) -> list:
        return [self.state]


# Files only ever replaced whole, through a temporary file renamed over them (save_tokens,
# Tokenizer.save), never written in place: a hard link to them stays the source run's file
# when the exported run resumes. Any other file is copied: evals.jsonl is appended to,
# valid_docs.txt and source.json are rewritten in place (prepare_lm_data), a fusion state
# cache is memory-mapped "w+"; through a hard link, each would change the source run's file.
_REPLACED_WHOLE = frozenset({"train.npy", "valid.npy", "tokenizer.model"})

MARKER = ".export.json"  # which trial of which run a directory is the export of


def _link_tree(src: Path, dest: Path) -> None:
    """dest as a copy of src, its _REPLACED_WHOLE files hard-linked where the file system
    allows; a file already in dest is kept (what an earlier or interrupted export wrote, or
    what the exported run wrote since)."""
    for root, _, files in os.walk(src):
        target = dest / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            frm, to = Path(root) / f, target / f
            if to.exists():
                continue
            if f in _REPLACED_WHOLE:
                try:
                    os.link(frm, to)
                    continue
                except OSError:
                    pass
            # through a temporary file: an interrupted export leaves no half file that its
            # rerun would keep
            tmp = to.with_name(f"{f}.tmp{os.getpid()}")
            try:
                shutil.copy2(frm, tmp)
                os.replace(tmp, to)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise


def _record(run: Path, k: int) -> dict:
    return {"run": str(run.resolve()), "trial": k}


def _check_destination(run: Path, k: int, dest: Path) -> None:
    """Refuse an --out whose files the export would replace or mix with its own: inside the
    source run (other than the trial's own directory), or not empty and not an export of this
    trial of this run (MARKER). Before anything is written."""
    own = tr.trial_dir(run, k)
    if dest.resolve() == own.resolve():
        return  # where its evaluations are: part of the export
    instead = f"give a new or empty directory (or no --out: {own})"
    source = run.resolve()
    if dest.resolve() == source or source in dest.resolve().parents:
        where = "is" if dest.resolve() == source else "is inside"
        raise ConfigError(f"--out {dest}: {where} the run that trial {k} is exported from "
                          f"({run}), whose files the export would change; {instead}",
                          field="out")
    if not dest.exists():
        return
    if not dest.is_dir():
        raise ConfigError(f"--out {dest}: not a directory; {instead}", field="out")
    names = sorted((p.name for p in dest.iterdir()), key=lambda n: (n.startswith("."), n))
    if not names:
        return
    try:
        record = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        record = None
    if record == _record(run, k):
        return  # the same export, interrupted or done: it goes on, keeping what it wrote
    if isinstance(record, dict) and {"run", "trial"} <= set(record):
        what = f"holds the export of trial {record['trial']} of {record['run']}"
    else:
        what = f"not empty (it holds {', '.join(names[:3])}{', …' if len(names) > 3 else ''})"
    raise ConfigError(f"--out {dest}: {what}; exporting trial {k} of {run} there would mix "
                      f"two runs' files; {instead}", field="out")


def _unmark(dest: Path) -> None:
    """Take back what a refused first export wrote: its marker and empty directories."""
    (dest / MARKER).unlink(missing_ok=True)
    for d in (dest / "checkpoints", dest):
        try:
            d.rmdir()  # only if empty
        except OSError:
            pass


def _mark(dest: Path, run: Path, k: int) -> None:
    """Write MARKER (atomically: a torn one would refuse the rerun), unless it is there."""
    if not (dest / MARKER).is_file():
        write_whole(dest / MARKER, json.dumps(_record(run, k)))


def export_trial(run_dir, k: int, task_for, out=None) -> Path:
    """Export trial k of the run in run_dir to `out` (default: its trial directory,
    <run>/trials/<k>, where its evaluations already are); returns that directory. task_for
    (jaxdepth.tasks.task_for) gives the Task that builds the model. Checkpoints already
    exported are kept; the others are written from the run's. Another `out` than the trial's
    directory must be new, empty or an export of the same trial (module docstring); else a
    ConfigError on field "out", before anything is written."""
    run = Path(run_dir)
    primary = jax.process_index() == 0
    mngr = ckpt.open_manager(run, read_only=True)
    try:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise ConfigError(f"--run: no checkpoint in {run / 'checkpoints'}", field="run")
        cfg = Config.from_dict(ckpt.saved_config(mngr, steps[-1]))
        cfgs = trial_configs(cfg)
        if len(cfgs) == 1:
            raise ConfigError(f"--trial: {run} is a run without trials (no run.seeds or "
                              f"trials list in its config)", field="trial")
        if not 0 <= k < len(cfgs):
            raise ConfigError(f"--trial {k}: {run} has trials 0-{len(cfgs) - 1}", field="trial")
        dest = Path(out) if out else tr.trial_dir(run, k)
        _check_destination(run, k, dest)
        # every process of a multi-process run exports together (Orbax reads and writes
        # collectively), each holding the state whole; its files are process 0's to write
        mesh = make_mesh(MeshConfig(data=jax.process_count()), devices=one_device_each())
        tx = make_optimizer(cfgs[0].optim, cfg.run.steps)
        abstract, shardings = state_shardings(cfgs, tx, mesh, task_for(cfgs[0]))
        fresh = not (dest / MARKER).is_file()  # no export of this trial here yet
        barrier("export_checked")
        if primary:
            dest.mkdir(parents=True, exist_ok=True)
            _mark(dest, run, k)
        barrier("export_marked")
        solo = ckpt.open_manager(dest, cfg.run.keep)
        done = set(solo.all_steps())
        unreadable = []
        try:
            for step in steps:
                if step in done:
                    continue
                try:
                    data = ckpt.data_states(ckpt.read_data_state(mngr, step), len(cfgs))
                    state = ckpt.restore(mngr, step, abstract, shardings)
                except Exception as e:
                    unreadable.append((step, ckpt.unreadable_because(e)))
                    continue
                ckpt.save(solo, step, state.trial(k), _SavedState(data[k]), cfgs[k])
                solo.wait_until_finished()
            exported = bool(solo.all_steps())
        finally:
            solo.close()
    finally:
        mngr.close()
    if not exported:  # an export without a checkpoint would be no run
        if fresh and primary:  # leave the directory as it was found: the refusal writes nothing
            _unmark(dest)
        what = "; ".join(f"step {s}: {why}" for s, why in unreadable)
        raise ckpt.NoReadableCheckpoint(f"no readable checkpoint in {run / 'checkpoints'} "
                                        f"({what}); nothing exported")
    if primary:
        for step, why in unreadable:
            warn(f"checkpoint {step} in {run / 'checkpoints'} is unreadable ({why}); not "
                 f"exported")
        _write_files(run, cfgs, k, dest)
    barrier("exported")
    return dest


def _write_files(run: Path, cfgs: list, k: int, dest: Path) -> None:
    """Trial k's files besides its checkpoints: its config, what its task wrote, its data,
    its metrics and its summary."""
    ckpt.write_config(dest, cfgs[k])
    own = tr.trial_dir(run, k)  # what its task wrote while training (evaluations, analyses)
    if own.is_dir() and own.resolve() != dest.resolve():
        _link_tree(own, dest)
    source = tr.data_dir(run, cfgs, k)
    if (source / "data").is_dir() and source.resolve() != dest.resolve():
        _link_tree(source / "data", dest / "data")
    _write_metrics(run / "metrics.jsonl", dest / "metrics.jsonl", k)
    summary = run / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        mine = s["trials"][k]
        run_level = {n: v for n, v in s.items()
                     if n not in ("trials", "mean", "ci95", "groups", "n_trials", "n_frozen",
                                  "evaluation")}
        write_whole(dest / "summary.json", json.dumps(
            {**run_level, **{n: v for n, v in mine.items() if n != "trial"},
             "run_dir": str(dest), "checkpoints": str(dest / "checkpoints"),
             "metrics": str(dest / "metrics.jsonl"), "exported_from": str(run),
             "trial": k}, indent=2))


def _write_metrics(src: Path, dest: Path, k: int) -> None:
    """Trial k's records of a run's metrics.jsonl, as its solo run would have written them."""
    if not src.is_file():
        return
    lines = []
    for line in src.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a run killed mid-write: its torn record
            continue
        if rec.pop("trial", None) == k:
            lines.append(json.dumps(rec))
    write_whole(dest, "".join(line + "\n" for line in lines))
