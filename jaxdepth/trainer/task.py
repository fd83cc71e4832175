"""What the trainer asks of a task: the one interface between the generic training code and
everything a kind of run decides for itself.

The trainer (loop, step, checkpoint) never names a model class or a task: it builds the model,
reads the data, computes the objective, counts FLOPs and evaluates only through these methods.
Implementations live in ``jaxdepth/tasks/`` (one module per kind of run) and are chosen by
``jaxdepth.tasks.task_for(config)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

import equinox as eqx
import grain
from jaxtyping import Array

from ..trial_axis import Models

# (fn, totals): totals(batch) gives the normalisers of a whole batch (e.g. its target-token
# count); fn(model, micro_batch, key, totals) -> (value, metrics) is the micro-batch's share
# of the batch objective. With a "divisor" in totals, fn returns sums and the step divides once.
Objective = tuple[Callable[..., tuple[Array, dict]], Callable[[dict], dict]]


@dataclass(frozen=True)
class EvalRequest:
    """What eval.py asks of a checkpoint (each field's eval.py flag in its metadata). A kind of
    run reads some of these (its task's EVAL_READS); eval.py refuses the others when given."""

    # the checkpoint's step; None: the latest
    step: int | None = field(default=None, metadata={"flag": "--step"})
    # comma-separated text/JSONL files to score instead of the run's validation set
    data: str = field(default="", metadata={"flag": "--data"})
    batch: int = field(default=0, metadata={"flag": "--batch"})  # 0: the run's batch size
    out: str = field(default="", metadata={"flag": "--out"})  # "": the run's default place
    # comma-separated splits of the run's task; "": the run's
    splits: str = field(default="", metadata={"flag": "--splits"})
    # read the task's files from here instead of the run's task.dir
    task_dir: str = field(default="", metadata={"flag": "--task-dir"})
    # at most this many examples per split; 0: all
    max_examples: int = field(default=0, metadata={"flag": "--max"})


class Task(Protocol):
    uses_dropout: bool  # the step draws a dropout key only when the model has dropout
    reports_perplexity: bool  # the train loss is a token NLL: log exp(loss) too
    EVAL_READS: ClassVar[frozenset[str]]  # the EvalRequest fields evaluate_checkpoint reads

    def build_model(self, *, key: Array) -> eqx.Module:
        """A freshly initialised model (also traced abstractly, under eval_shape)."""

    def trainable(self, model: eqx.Module) -> Any:
        """Filter spec of the arrays the optimiser updates."""

    def trial_shared(self, model: eqx.Module) -> Any:
        """Filter spec of the arrays that every trial of a run with trials holds alike and
        that never train (task.init_from's frozen backbone), so that they are stored once,
        not K times (trainer/trials.py); None: each trial holds all of its arrays. Asked
        only when every trial has the same task.init_from."""

    def prepare(self, run_dir: Path, primary: bool, barrier: Callable[[], None]) -> Any:
        """Read or build the data (tokenizer, datasets, evaluation sets) into run_dir and
        return it: one frozen value of the type the kind's module declares (``LMPrepared``,
        ``NERPrepared``, ...), which the task keeps as ``prepared``; the later methods read
        the data from it alone."""

    def write_outputs_to(self, directory: Path) -> None:
        """Write what the task outputs while training (evaluations, analyses, predictions,
        caches) there, not in the run directory: each trial of a run with trials has its own
        (trainer/trials.py). Called after prepare."""

    def share_shapes(self, tasks: list["Task"]) -> None:
        """A run with trials (trainer/trials.py), after every trial's prepare: make the
        trials' tasks (this one among them) agree on the sizes their stacked batches and
        their one compiled step share, where a task derives them from its data (tasks/ner.py:
        word slots per sentence and bounds on the slots in use), so that each trial still
        computes what its solo run does."""

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

    def flops_per_token(self, model: eqx.Module) -> int: ...

    def param_count(self, model: eqx.Module) -> int: ...

    def evaluate(self, models: Models, tasks: list["Task"], step: int, sharding,
                 final: bool) -> list[tuple[dict, str]]:
        """Each trial's (metrics, one-line message) at an evaluation point, in order: the
        models given as ``Models`` (one model for a solo run, ``Models(model)`` with
        ``[task]``) and their tasks, this one first. A kind whose trials evaluate on the same
        inputs runs the device work vmapped over the trials; each trial's task still writes
        its own outputs."""

    def vmaps_evaluation(self, tasks: list["Task"]) -> bool:
        """Whether evaluate runs these trials' evaluation vmapped (summary.json's
        "evaluation"), rather than trial by trial."""

    def summary(self, model: eqx.Module) -> dict:
        """What summary.json adds for this kind of run."""

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """eval.py: evaluate a checkpoint of ``run`` (trained by this kind of run), write
        its files and return the result it prints (naming the files)."""
