"""What the trial machinery (run_trials.py, trials.py) asks of a task beyond trainer/task.py's
Task: only a run with K > 1 trials asks it, and a kind writes only what it needs. Where a
kind has none of the optional methods, the trial machinery's defaults hold (``share_shapes``
absent: its shapes follow from the config alone; ``trial_shared`` absent: each trial holds all
of its arrays; ``evaluates_alike`` or ``evaluate_all`` absent: trial by trial)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import equinox as eqx

from ..trial_axis import Models


class TrialTask(Protocol):
    def write_outputs_to(self, directory: Path) -> None:
        """Write what the task outputs while training (evaluations, analyses, predictions,
        caches) there, not in the run directory: each trial has its own. Called after
        prepare. Every kind has it (tasks/task_base.py)."""


class SharesShapes(Protocol):
    @staticmethod
    def share_shapes(tasks: list) -> None:
        """After every trial's prepare: make the trials' tasks agree on the sizes their
        stacked batches and their one compiled step share, where a task derives them from its
        data (tasks/ner.py: bounds on the word slots in use), so that each trial still
        computes what its solo run does."""


class SharesArrays(Protocol):
    def trial_shared(self, model: eqx.Module) -> Any:
        """Filter spec of the arrays that every trial holds alike and that never train
        (task.init_from's frozen backbone), so that they are stored once, not K times
        (trials.py); None: each trial holds all of its arrays. Asked only when every trial
        has the same task.init_from."""


class EvaluatesAlike(Protocol):
    def evaluates_alike(self, tasks: list) -> bool:
        """Whether every trial's task evaluates on the same inputs as this one: then its
        ``evaluate_all`` runs the device work vmapped over the trials."""

    def evaluate_all(self, models: Models, tasks: list, step: int, sharding,
                     final: bool) -> list[tuple[dict, str]]:
        """Each trial's (metrics, message) from one pass over the stacked models, in order of
        ``tasks`` (every trial's, this one first): the device work runs once over all of
        them; each trial's task still writes its own outputs. A kind that has it evaluates
        one model through it too (``Models(model)``, ``[task]``: tasks/task_base.py)."""
