"""The one path every run takes: its K >= 1 trials (``Trials``), each the solo run its own
config describes; a run without trials is K = 1. trials.py holds how K > 1 trials are stacked,
stepped, restored and summarised; this module chooses, per question the loop asks, between
that and the one trial held as it is."""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ..config import Config
from ..data.corpus.pipeline import lm_iterator
from ..trial_axis import Models
from . import checkpoint as ckpt
from . import sharding as shd
from .step import make_train_step, sharded_init, state_shardings
from .task import Task
from .trials import (TrialIterator, aggregate, batch_sharding, data_dir, label,
                     make_trials_step, one_abstract_model, own_pretrained, restore, settings,
                     trial_dir, trial_shardings, trials_init, varying)


class Trials:
    """A run's K >= 1 trials (trial_grid.trial_configs), each with its own task, as the one path
    every run takes: a run without trials is K = 1. What the loop asks of the state (its
    shardings, initialisation, restore, step, data, models and freezing) is asked here.

    K > 1 trials are held stacked on a leading trial axis (TrialState), the per-trial update
    vmapped over it. K = 1 is held squeezed: the TrainState itself, the update called as it
    is. So a one-trial run compiles the same program, and writes the same checkpoint and
    data-state layouts, as a run without trials always has: bit for bit the same run, and
    every checkpoint written before trials existed still resumes."""

    def __init__(self, cfgs: list[Config], tasks: list[Task], mesh: Mesh):
        if len(tasks) != len(cfgs):
            raise ValueError(f"{len(cfgs)} trials need as many tasks, got {len(tasks)}")
        self.cfgs, self.tasks, self.mesh = cfgs, tasks, mesh
        self.k = len(cfgs)
        self.stacked = self.k > 1
        self.fields = varying(cfgs)  # [] for one trial: nothing sets it apart
        self.names = [label(c, self.fields) for c in cfgs]  # "run.seed=1, optim.lr=0.003"
        self._vmaps = None  # vmaps_evaluation, once decided

    # ------------------------------------------------------------------ what a trial is called

    def tag(self, k: int) -> dict:
        """What a record of trial k carries to say whose it is ({} for a run of one)."""
        return {"trial": k} if self.stacked else {}

    def prefix(self, k: int) -> str:
        return f"trial {k}: " if self.stacked else ""

    def named(self, k: int) -> str:
        """What starts a warning about trial k: "trial 1 (optim.lr=1e-12): " ("" for one)."""
        return f"trial {k} ({self.names[k]}): " if self.stacked else ""

    # ------------------------------------------------------------------ data

    def prepare(self, run_dir: Path, primary: bool, barrier) -> None:
        """Each trial's task prepares its data (where its solo run would: data_dir) and writes
        its outputs to its trial directory (the run directory for a run of one); then the
        tasks agree on the shapes their stacked batches share."""
        for k, t in enumerate(self.tasks):
            t.prepare(data_dir(run_dir, self.cfgs, k), primary, barrier)
            if self.stacked:
                out = trial_dir(run_dir, k)  # its evaluations and analyses
                if primary:
                    out.mkdir(parents=True, exist_ok=True)
                t.write_outputs_to(out)
        share = getattr(self.tasks[0], "share_shapes", None)  # trial_task.py: SharesShapes
        if self.stacked and share is not None:
            share(self.tasks)

    def iterator(self):
        """The training batches: each trial's from its own task, stacked when K > 1."""
        its = [lm_iterator(t.dataset()) for t in self.tasks]
        return TrialIterator(its) if self.stacked else its[0]

    def batch_sharding(self) -> NamedSharding:
        if self.stacked:
            return batch_sharding(self.mesh, self.k)
        return shd.batch_sharding(self.mesh)

    # ------------------------------------------------------------------ state

    def shardings(self, tx):
        """(abstract state, matching pytree of NamedShardings)."""
        if self.stacked:
            return trial_shardings(self.cfgs, tx, self.mesh, self.tasks[0])
        return state_shardings(self.cfgs[0], tx, self.mesh, self.tasks[0])

    def init(self, tx, abstract, shardings):
        """(a fresh state placed with `shardings`, whether its weights are all fresh): each
        trial's weights those of a solo run of its seed, with its task's pretrained arrays."""
        task = self.tasks[0]
        if not self.stacked:
            pretrained = task.initial_model(self.mesh, abstract.model)
            return (sharded_init(self.cfgs[0], tx, self.mesh, task, shardings, pretrained),
                    pretrained is None)
        model = one_abstract_model(abstract)
        if own_pretrained(self.cfgs):
            pretrained = [t.initial_model(self.mesh, model) for t in self.tasks]
            fresh = all(p is None for p in pretrained)
        else:
            pretrained = task.initial_model(self.mesh, model)
            fresh = pretrained is None
        return trials_init(self.cfgs, tx, task, shardings, pretrained), fresh

    def restore(self, mngr, step: int, abstract, shardings):
        return (restore if self.stacked else ckpt.restore)(mngr, step, abstract, shardings)

    def make_step(self, tx, shardings, on_compile=None):
        """run(state, batch) -> (state, metrics: scalars, or [K] arrays with "frozen")."""
        if self.stacked:
            return make_trials_step(self.cfgs, self.mesh, shardings, self.tasks, on_compile)
        return make_train_step(self.cfgs[0], tx, self.mesh, shardings, self.tasks[0],
                               on_compile)

    # ------------------------------------------------------------------ evaluation

    def vmaps_evaluation(self) -> bool:
        """Whether the K > 1 trials are evaluated in one pass vmapped over them (summary.json's
        "evaluation"), rather than trial by trial: trials.evaluation says whether it may (auto:
        off the CPU), the kind whether its trials evaluate alike (trial_task.py)."""
        if self._vmaps is None:
            # Decided once per run: the trials' evaluation inputs are fixed after prepare and
            # model_ready, and comparing them (whole validation sets) is not free.
            task, how = self.tasks[0], self.cfgs[0].trials.evaluation
            self._vmaps = self.stacked \
                and (how == "vmapped" or (how == "auto" and jax.default_backend() != "cpu")) \
                and hasattr(task, "evaluate_all") and hasattr(task, "evaluates_alike") \
                and task.evaluates_alike(self.tasks)
        return self._vmaps

    def evaluate(self, state, step: int, sharding, final: bool) -> list[tuple[dict, str]]:
        """Each trial's (metrics, one-line message), by its own task: in one vmapped pass
        where vmaps_evaluation says so (trial_task.py's evaluate_all), else each trial alone
        (Task.evaluate; a run of one: its task)."""
        models = self.models(state)
        if self.vmaps_evaluation():
            return self.tasks[0].evaluate_all(models, self.tasks, step, sharding, final)
        return [t.evaluate(models.one(k), step, sharding, final) for k, t in enumerate(self.tasks)]

    def models(self, state) -> Models:
        """The trials' models, for an evaluation (Models: one call for every trial)."""
        return state.models() if self.stacked else Models(state.model)

    def frozen(self, state) -> np.ndarray:
        """bool[K]: the trials frozen by a non-finite value (a run of one stops instead)."""
        if self.stacked:
            return np.asarray(jax.device_get(state.frozen))
        return np.zeros(1, bool)

    def all_frozen(self, k: int, why: str) -> str:
        """What stops the run when trial k, the last one going, turns non-finite."""
        return f"every trial is frozen (trial {k}, {self.names[k]}: {why})" if self.stacked \
            else why

    def rows(self, metrics) -> list[dict]:
        """A step's metrics read to the host (a sync point), one dict of floats per trial."""
        host = jax.device_get(metrics)
        return [{k: float(np.asarray(v).reshape(-1)[i]) for k, v in host.items()}
                for i in range(self.k)]

    # ------------------------------------------------------------------ summary

    def settings(self, k: int) -> dict:
        """{setting: value} of what sets trial k apart (run.seed always)."""
        return settings(self.cfgs[k], self.fields)

    def summary(self, run_level: dict, facts: dict, results: list[dict],
                task_summaries: list[dict], frozen: np.ndarray) -> dict:
        """summary.json's figures: a run of one has its trial's results and task summary at
        the top level, as a run without trials always had; K trials have each trial's entry
        and their means (aggregate), with how they were evaluated. run_level: the run's
        training figures; facts: its size and peak."""
        if not self.stacked:
            return {**run_level, **results[0], **facts, **task_summaries[0]}
        per_trial = [{"trial": k, "settings": self.settings(k), "frozen": bool(frozen[k]),
                      **results[k], **task_summaries[k]} for k in range(self.k)]
        run_level = {n: v for n, v in run_level.items() if n != "train_loss"}  # a trial's
        return {**run_level, **facts, **aggregate(per_trial), "evaluation": (
            "vmapped" if self.vmaps_evaluation() else "trial by trial")}
