"""A run's K >= 1 trials: what sets each apart, its data, its evaluation and its summary; and
a trial exported as its own run (``export_trial``).

A run with ``run.seeds`` or a ``trials`` list (config.trials.trial_grid) has K trials, each
exactly the solo run its own config describes (config.trials.trial_configs), with its own task
and so its own data; a run without trials is K = 1. Their state is one TrainState on a leading
trial axis (state.py). A run of one reads as a solo run always has: its records, messages,
summary and outputs name no trial, its outputs go to the run directory (``Trials.several``
decides only that, here).

An exported trial is the single-trial run directory its solo run would have written (every
checkpoint of the run as that trial's own, its config, metrics, summary and data): what reads
a run reads it unchanged, and it resumes as a solo run. It goes to <run>/trials/<k> or to a
directory outside the run that is new, empty, or an export of the same trial of the same run
(its marker, .export.json, written first): a rerun finishes or refreshes it, keeping the
checkpoints it wrote and writing the other files afresh. Any other directory is refused before
anything is written (the export would mix two runs' files); of the source run, only
<run>/trials/<k> is written to, and only when it is the destination.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from ..config import Config, ConfigError, MeshConfig
from ..config.trials import own_pretrained, setting_value, trial_configs, varying
from ..errors import warn
from ..files import read_jsonl, write_whole
from ..data.corpus.pipeline import lm_iterator
from . import checkpoint as ckpt, restore as rs
from . import state as st
from ..optim import make_optimizer
from .processes import barrier, one_device_each
from .sharding import make_mesh
from .state import state_shardings
from .task import Task


def trial_dir(run_dir: Path, k: int) -> Path:
    """Trial k's directory in a run with trials: its evaluations and analyses while training,
    and the single-trial run it is exported to (export_trial)."""
    return Path(run_dir) / "trials" / str(k)


# Settings that change what a trial's task prepares (its sample of the data, splits a
# tokenizer may be trained on, the pretrained run its tokenizer comes from): such a trial
# prepares its data in its own directory.
DATA_SETTINGS = ("task.seed", "task.n_shot", "task.init_from", "data.tokenizer")


def data_dir(run_dir: Path, cfgs: list[Config], k: int) -> Path:
    """Where trial k's task prepares its data: the run directory, shared with trial 0, unless
    its DATA_SETTINGS differ from trial 0's (then its own trial directory, as its solo run
    would prepare it)."""
    own = any(setting_value(cfgs[k], f) != setting_value(cfgs[0], f) for f in DATA_SETTINGS)
    return trial_dir(run_dir, k) if own else Path(run_dir)


def settings(cfg: Config, fields: list[str]) -> dict:
    """{setting: value} of what sets this trial apart (run.seed always)."""
    return {f: setting_value(cfg, f)
            for f in ["run.seed"] + [f for f in fields if f != "run.seed"]}


class Batches:
    """The trials' data iterators as one: ``next`` stacks their batches on a leading trial
    axis; ``states``/``set_states`` are each trial's iterator state (checkpoint.py decides
    how a checkpoint holds them)."""

    def __init__(self, iterators: list):
        self.iterators = iterators

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batches = [next(it) for it in self.iterators]
        return {k: np.stack([b[k] for b in batches]) for k in batches[0]}

    def states(self) -> list:
        return [it.get_state() for it in self.iterators]

    def set_states(self, states: list) -> None:
        if len(states) != len(self.iterators):
            raise ValueError(f"the checkpoint's data state holds {len(states)} trials' "
                             f"iterators, not {len(self.iterators)}")
        for it, s in zip(self.iterators, states):
            it.set_state(s if isinstance(it.get_state(), dict) else json.dumps(s).encode())

    def start_prefetch(self) -> None:
        for it in self.iterators:
            if hasattr(it, "start_prefetch"):
                it.start_prefetch()


class Trials:
    """A run's K >= 1 trials (config.trials.trial_configs), each with its own task."""

    def __init__(self, cfgs: list[Config], tasks: list[Task], mesh: Mesh):
        if len(tasks) != len(cfgs):
            raise ValueError(f"{len(cfgs)} trials need as many tasks, got {len(tasks)}")
        self.cfgs, self.tasks, self.mesh = cfgs, tasks, mesh
        self.k = len(cfgs)
        self.several = self.k > 1  # what a run of one does not name (the module docstring)
        self.fields = varying(cfgs)  # [] for one trial: nothing sets it apart
        self.names = [", ".join(f"{f}={v}" for f, v in settings(c, self.fields).items())
                      for c in cfgs]  # "run.seed=1, optim.lr=0.003"
        self._vmaps = None  # vmaps_evaluation, once decided

    # ------------------------------------------------------------------ what a trial is called

    def tag(self, k: int) -> dict:
        """What a record of trial k carries to say whose it is ({} for a run of one)."""
        return {"trial": k} if self.several else {}

    def prefix(self, k: int) -> str:
        return f"trial {k}: " if self.several else ""

    def named(self, k: int) -> str:
        """What starts a warning about trial k: "trial 1 (optim.lr=1e-12): " ("" for one)."""
        return f"trial {k} ({self.names[k]}): " if self.several else ""

    # ------------------------------------------------------------------ data

    def prepare(self, run_dir: Path, primary: bool, barrier) -> None:
        """Each trial's task prepares its data (where its solo run would: data_dir) and writes
        its outputs to its trial directory (the run directory for a run of one); then the
        tasks agree on the shapes their stacked batches share."""
        for k, t in enumerate(self.tasks):
            t.prepare(data_dir(run_dir, self.cfgs, k), primary, barrier)
            if self.several:
                out = trial_dir(run_dir, k)  # its evaluations and analyses
                if primary:
                    out.mkdir(parents=True, exist_ok=True)
                t.write_outputs_to(out)
        self.tasks[0].share_shapes(self.tasks)

    def batches(self) -> Batches:
        """The training batches [K, B, ...], each trial's from its own task."""
        return Batches([lm_iterator(t.dataset()) for t in self.tasks])

    # ------------------------------------------------------------------ state

    def shardings(self, tx):
        """(abstract state, matching pytree of NamedShardings)."""
        return st.state_shardings(self.cfgs, tx, self.mesh, self.tasks[0])

    def init(self, tx, abstract, shardings):
        """(a fresh state placed with `shardings`, whether its weights are all fresh): each
        trial's weights those of a solo run of its seed, with its task's pretrained arrays."""
        model = st.abstract_model(abstract)
        if own_pretrained(self.cfgs):
            pretrained = [t.initial_model(self.mesh, model) for t in self.tasks]
            fresh = all(p is None for p in pretrained)
        else:
            pretrained = self.tasks[0].initial_model(self.mesh, model)
            fresh = pretrained is None
        return st.initialise(self.cfgs, tx, self.tasks[0], shardings, pretrained), fresh

    def make_step(self, shardings, on_compile=None):
        """run(state, batch) -> (state, metrics of [K] arrays, with "frozen")."""
        return st.make_step(self.cfgs, self.mesh, shardings, self.tasks, on_compile)

    # ------------------------------------------------------------------ evaluation

    def vmaps_evaluation(self) -> bool:
        """Whether the trials are evaluated in one pass over the stacked models (summary.json's
        "evaluation"), rather than trial by trial: trials.evaluation says whether it may (auto:
        off the CPU), the tasks whether they evaluate alike (Task.evaluates_alike)."""
        if self._vmaps is None:
            # Decided once per run: the trials' evaluation inputs are fixed after prepare and
            # model_ready, and comparing them (whole validation sets) is not free.
            how = self.cfgs[0].trials.evaluation
            self._vmaps = ((how == "vmapped" or (how == "auto" and jax.default_backend() != "cpu"))
                           and self.tasks[0].evaluates_alike(self.tasks))
        return self._vmaps

    def evaluate(self, state, step: int, sharding, final: bool) -> list[tuple[dict, str]]:
        """Each trial's (metrics, one-line message), by its own task: in one pass over the
        stacked models where vmaps_evaluation says so, else each trial alone."""
        models = state.models()
        if self.vmaps_evaluation():
            return self.tasks[0].evaluate(models, self.tasks, step, sharding, final)
        return [t.evaluate(models.pick(k), [t], step, sharding, final)[0]
                for k, t in enumerate(self.tasks)]

    def rows(self, metrics) -> list[dict]:
        """A step's metrics read to the host (a sync point), one dict of floats per trial; a
        run of one has no "frozen" of its own (its first non-finite value stops it)."""
        host = jax.device_get(metrics)
        return [{n: float(np.asarray(v).reshape(-1)[i]) for n, v in host.items()
                 if self.several or n != "frozen"} for i in range(self.k)]

    # ------------------------------------------------------------------ summary

    def summary(self, run_level: dict, facts: dict, results: list[dict],
                task_summaries: list[dict], frozen: np.ndarray) -> dict:
        """summary.json's figures: a run of one has its trial's results and task summary at
        the top level, as a run without trials always had; K trials have each trial's entry
        and their means (aggregate), with how they were evaluated. run_level: the run's
        training figures; facts: its size and peak."""
        if not self.several:
            return {**run_level, **results[0], **facts, **task_summaries[0]}
        per_trial = [{"trial": k, "settings": settings(self.cfgs[k], self.fields),
                      "frozen": bool(frozen[k]), **results[k], **task_summaries[k]}
                     for k in range(self.k)]
        run_level = {n: v for n, v in run_level.items() if n != "train_loss"}  # a trial's
        return {**run_level, **facts, **aggregate(per_trial), "evaluation": (
            "vmapped" if self.vmaps_evaluation() else "trial by trial")}


def _mean_ci(entries: list[dict]) -> tuple[dict, dict]:
    """(mean, 95% t half-width) of each number every entry reports (no half-width for one)."""
    from ..analysis.exact_match import mean_ci95

    keys = [k for k, v in (entries[0].items() if entries else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "trial"
            and all(isinstance(t.get(k), (int, float)) for t in entries)]
    mean, ci95 = {}, {}
    for k in keys:
        values = [float(t[k]) for t in entries]
        if len(values) >= 2:
            mean[k], ci95[k] = mean_ci95(values)
        else:
            mean[k] = values[0]
    return mean, ci95


def aggregate(per_trial: list[dict]) -> dict:
    """summary.json's trial part: every trial's entry and, over the trials not frozen, the
    mean and the half-width of the 95% t interval of each number they all report: over all
    of them ("mean", "ci95") when only the seed varies, else per setting of the other trial
    fields ("groups": the seeds of each learning rate, say)."""
    live = [t for t in per_trial if not t["frozen"]]
    out = {"n_trials": len(per_trial), "n_frozen": len(per_trial) - len(live)}
    groups: dict[str, list[dict]] = {}
    for t in live:
        rest = {k: v for k, v in t["settings"].items() if k != "run.seed"}
        groups.setdefault(json.dumps(rest, sort_keys=True), []).append(t)
    if len(groups) <= 1:
        out["mean"], out["ci95"] = _mean_ci(live)
    else:
        out["groups"] = []
        for key, entries in groups.items():
            mean, ci95 = _mean_ci(entries)
            out["groups"].append({"settings": json.loads(key),
                                  "trials": [t["trial"] for t in entries],
                                  "mean": mean, "ci95": ci95})
    return {**out, "trials": per_trial}


# ----------------------------------------------------------------------------- exporting a trial

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
    own = trial_dir(run, k)
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
        with contextlib.suppress(OSError):
            d.rmdir()  # only if empty


def export_trial(run_dir, k: int, task_for, out=None) -> Path:
    """Export trial k of the run in run_dir to `out` (default: <run>/trials/<k>) as the module
    docstring says; returns that directory. task_for (jaxdepth.tasks.task_for) gives the Task
    that builds the model. A refused `out` is a ConfigError on field "out"."""
    run = Path(run_dir)
    primary = jax.process_index() == 0
    mngr = ckpt.open_manager(run, read_only=True)
    try:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise ConfigError(f"--run: no checkpoint in {run / 'checkpoints'}", field="run")
        cfg = Config.from_dict(rs.saved_config(mngr, steps[-1]))
        cfgs = trial_configs(cfg)
        if len(cfgs) == 1:
            raise ConfigError(f"--trial: {run} is a run without trials (no run.seeds or "
                              f"trials list in its config)", field="trial")
        if not 0 <= k < len(cfgs):
            raise ConfigError(f"--trial {k}: {run} has trials 0-{len(cfgs) - 1}", field="trial")
        dest = Path(out) if out else trial_dir(run, k)
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
            if fresh:  # written atomically: a torn marker would refuse the rerun
                write_whole(dest / MARKER, json.dumps(_record(run, k)))
        barrier("export_marked")
        solo = ckpt.open_manager(dest, cfg.run.keep)
        done = set(solo.all_steps())
        unreadable = []
        try:
            for step in steps:
                if step in done:
                    continue
                try:
                    data = rs.data_states(rs.read_data_state(mngr, step), len(cfgs))
                    state = rs.restore_state(mngr, step, abstract, shardings)
                except Exception as e:
                    unreadable.append((step, rs.unreadable_because(e)))
                    continue
                ckpt.save(solo, step, state.trial(k), [data[k]], cfgs[k])
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
        raise rs.NoReadableCheckpoint(f"no readable checkpoint in {run / 'checkpoints'} "
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
    write_whole(dest / "config.json", cfgs[k].to_json())
    own = trial_dir(run, k)  # what its task wrote while training (evaluations, analyses)
    if own.is_dir() and own.resolve() != dest.resolve():
        _link_tree(own, dest)
    source = data_dir(run, cfgs, k)
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
    if src.is_file():  # (read without the torn record of a run killed mid-write)
        mine = [rec for rec in read_jsonl(src) if rec.pop("trial", None) == k]
        write_whole(dest, "".join(json.dumps(rec) + "\n" for rec in mine))
