"""What the trainer asks of a task: the one interface between the generic training code and
everything a kind of run decides for itself.

The trainer (loop, step, checkpoint) never names a model class or a task: it builds the model,
reads the data, computes the objective and evaluates only through these methods, and calls
nothing else of a task; what trains, dropout, the parameter count and FLOPs per token are the
model's own answers (models/declared.py: Declared). Implementations live in
``jaxdepth/tasks/`` (one module per kind of run, on ``tasks/task_base.py``'s defaults), chosen
by ``jaxdepth.tasks.task_for(config)``.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Protocol

import equinox as eqx
import grain
from jaxtyping import Array

from ..models.trial_axis import Models


# (fn, totals): totals(batch) gives the normalisers of a whole batch (e.g. its target-token
# count); fn(model, micro_batch, key, totals) -> (value, metrics) is the micro-batch's share
# of the batch objective. With a "divisor" in totals, fn returns sums and the step divides once.
Objective = tuple[Callable[..., tuple[Array, dict]], Callable[[dict], dict]]


class Task(Protocol):
    reports_perplexity: bool  # the train loss is a token NLL: log exp(loss) too
    # keyword arguments of the model's flops_per_token for this task's training step, where
    # its batches make the step skip part of the model ({}: the whole model runs)
    step_flops: Mapping[str, Any]

    def build_model(self, *, key: Array) -> eqx.Module:
        """A freshly initialised model (also traced abstractly, under eval_shape)."""

    def prepare(self, run_dir: Path, primary: bool, barrier: Callable[[], None]) -> Any:
        """Read or build the data (tokenizer, datasets, evaluation sets) into run_dir and
        return it: one frozen value of the type the kind's module declares (``LMPrepared``,
        ``NERPrepared``, ...), which the task keeps as ``prepared``; the later methods read
        the data from it alone."""

    def dataset(self) -> grain.MapDataset:
        """Global batches as a function of (seed, step): the training stream."""

    def initial_model(self, mesh, fresh: eqx.Module) -> eqx.Module | None:
        """`fresh` (abstract: jax.ShapeDtypeStruct leaves) with the task's pretrained arrays
        in place of the parts they replace, or None to start from a fresh model."""

    def model_ready(self, model: eqx.Module) -> None:
        """The model is initialised or restored; no batch has been read yet. A task may
        compute here what depends only on weights that never train (fusion.mode=fe: the
        frozen backbone's states, tasks/ner.py)."""

    def objective(self) -> Objective: ...

    def evaluate(self, models: Models, tasks: list["Task"], step: int, sharding,
                 final: bool) -> list[tuple[dict, str]]:
        """Each model's (metrics, one-line message) at an evaluation point, tasks[k] the task
        of models' model k (this one first). One model (``Models(model), [self]``), or K
        trials whose tasks evaluate alike (``evaluates_alike``): the device work runs once over
        all of them, and each trial's task still writes its own outputs."""

    def evaluates_alike(self, tasks: list["Task"]) -> bool:
        """Whether every trial's task evaluates on the same inputs as this one, so that one
        ``evaluate`` may run the device work over their stacked models."""

    @staticmethod
    def share_shapes(tasks: list["Task"]) -> None:
        """After every trial's prepare: make the trials' tasks agree on the sizes their
        stacked batches and their one compiled step share, where a task derives them from its
        data (tasks/ner.py: bounds on the word slots in use), so that each trial still
        computes what its solo run does. A run of one calls it too: nothing changes."""

    @staticmethod
    def share_start(tasks: list["Task"]) -> None:
        """After the state is initialised or restored: every trial that started from the same
        pretrained weights as tasks[0] reports where they came from as tasks[0] does (only
        tasks[0] reads weights the trials share). A run of one calls it too: nothing changes."""

    def trial_shared(self, model: eqx.Module) -> Any:
        """Filter spec of the arrays that every trial holds alike and that never train
        (task.init_from's frozen backbone), so that they are stored once, not K times
        (state.py); None: each trial holds all of its arrays. Asked only when every trial
        has the same task.init_from."""

    def write_outputs_to(self, directory: Path) -> None:
        """Write what the task outputs while training (evaluations, analyses, predictions,
        caches) there, not in the run directory prepare was given: each trial of several
        has its own. Called after prepare."""

    def summary(self, model: eqx.Module) -> dict:
        """What summary.json adds for this kind of run."""
