"""A run's K >= 1 trials: what sets each apart, its data, its evaluation and its summary.

A run with ``run.seeds`` or a ``trials`` list (trial_grid.trial_grid) has K trials, each exactly
the solo run its own config describes (trial_grid.trial_configs), with its own task and so its
own data; a run without trials is K = 1. Their state is one TrainState on a leading trial axis
(state.py). A run of one reads as a solo run always has: its records, messages, summary and
outputs name no trial, its outputs go to the run directory (``Trials.several`` decides only
that, here).
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from ..config import Config
from ..data.corpus.pipeline import lm_iterator
from . import state as st
from .task import Task


def trial_dir(run_dir: Path, k: int) -> Path:
    """Trial k's directory in a run with trials: its evaluations and analyses while training,
    and the single-trial run it is exported to (trial_export.py)."""
    return Path(run_dir) / "trials" / str(k)


# Settings that change what a trial's task prepares (its sample of the data, splits a
# tokenizer may be trained on, the pretrained run its tokenizer comes from): such a trial
# prepares its data in its own directory.
DATA_SETTINGS = ("task.seed", "task.n_shot", "task.init_from", "data.tokenizer")


def data_dir(run_dir: Path, cfgs: list[Config], k: int) -> Path:
    """Where trial k's task prepares its data: the run directory, shared with trial 0, unless
    its DATA_SETTINGS differ from trial 0's (then its own trial directory, as its solo run
    would prepare it)."""
    own = any(st.value(cfgs[k], f) != st.value(cfgs[0], f) for f in DATA_SETTINGS)
    return trial_dir(run_dir, k) if own else Path(run_dir)


def settings(cfg: Config, fields: list[str]) -> dict:
    """{setting: value} of what sets this trial apart (run.seed always)."""
    return {f: st.value(cfg, f) for f in ["run.seed"] + [f for f in fields if f != "run.seed"]}


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
    """A run's K >= 1 trials (trial_grid.trial_configs), each with its own task."""

    def __init__(self, cfgs: list[Config], tasks: list[Task], mesh: Mesh):
        if len(tasks) != len(cfgs):
            raise ValueError(f"{len(cfgs)} trials need as many tasks, got {len(tasks)}")
        self.cfgs, self.tasks, self.mesh = cfgs, tasks, mesh
        self.k = len(cfgs)
        self.several = self.k > 1  # what a run of one does not name (the module docstring)
        self.fields = st.varying(cfgs)  # [] for one trial: nothing sets it apart
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

    def all_frozen(self, k: int, why: str) -> str:
        """What stops the run when trial k, the last one going, turns non-finite."""
        return f"every trial is frozen (trial {k}, {self.names[k]}: {why})" if self.several \
            else why

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
        if st.own_pretrained(self.cfgs):
            pretrained = [t.initial_model(self.mesh, model) for t in self.tasks]
            fresh = all(p is None for p in pretrained)
        else:
            pretrained = self.tasks[0].initial_model(self.mesh, model)
            fresh = pretrained is None
        return st.initialise(self.cfgs, tx, self.tasks[0], shardings, pretrained), fresh

    def make_step(self, shardings, on_compile=None):
        """run(state, batch) -> (state, metrics of [K] arrays, with "frozen")."""
        return st.make_step(self.cfgs, self.mesh, shardings, self.tasks, on_compile)

    def batch_sharding(self):
        return st.batch_sharding(self.mesh, self.k)

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
