"""What every task shares: defaults of the trainer's Task interface (trainer/task.py)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import jax
import numpy as np

from ..choices import Choices, Registered
from ..config import Config
from ..files import write_whole


_TASKS: Choices[type["TaskBase"]] = Choices("Task of run kind", None)

# In the data directory: the step of task.init_from the run's weights were read from, written
# when they are read, so that a resume (which reads no pretrained weights) still reports it.
STARTED_FROM = "started_from.json"


def runner(kind: type) -> type:
    """The Task class that runs run kind ``kind`` (the one whose ``RUNS`` it is)."""
    return _TASKS(kind.NAME)


class TaskBase(Registered):
    """Defaults: no pretrained weights, nothing to do once the model is ready. What trains,
    dropout, parameters and FLOPs are the model's own answers (models/declared.py).

    Each task also says what eval.py does with one of its checkpoints
    (``evaluate_checkpoint(run, request)``, reading the request's ``EVAL_READS``:
    eval_request.py's CheckpointEval); what train.py prints of its summary is
    jaxdepth/tasks/summary_text.py's."""

    # The run kind (jaxdepth/config/run_kinds/) this class runs: config.py decides a config's kind
    # while it validates, so the kind cannot import its Task; the Task imports its kind.
    RUNS: ClassVar[type | None] = None
    reports_perplexity = False
    # the whole model runs in a step (tasks/ner.py's cache: not so); read-only, shared
    step_flops: Mapping[str, Any] = MappingProxyType({})
    # task.init_from's checkpoint step, once initial_model read it or prepare its record
    init_step: int | None = None
    prepared: Any = None  # what prepare returned; None before it
    data_dir: Path | None = None  # where prepare read the data; None before it
    primary = False  # the process that writes the run's files (prepare says)

    REGISTRY = _TASKS  # a class registers under the name of the kind it RUNS

    def __init_subclass__(cls, **kw):
        if cls.__dict__.get("RUNS") is not None:
            cls.NAME = cls.RUNS.NAME
        super().__init_subclass__(**kw)

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def prepare(self, run_dir: Path, primary: bool, barrier) -> Any:
        """The kind's ``read_data`` (its data as one frozen value of the type its module
        declares), kept as ``self.prepared`` for the later methods, the only state they read
        besides where the outputs go (``run_dir``, ``primary``; ``write_outputs_to``) and the
        pretrained step an earlier invocation recorded in the data directory
        (``started_from``)."""
        self.run_dir, self.data_dir, self.primary = run_dir, Path(run_dir), primary
        self.prepared = self.read_data(run_dir, primary, barrier)
        record = self.data_dir / STARTED_FROM
        if self.cfg.task.init_from and record.is_file():
            saved = json.loads(record.read_text())
            if saved["init_from"] == self.cfg.task.init_from:
                self.init_step = saved["init_step"]
        return self.prepared

    def started_from(self, step: int | None) -> None:
        """The run's weights were read from checkpoint `step` of task.init_from (None: a
        source without steps, a Hugging Face directory): kept as ``init_step`` and in the data
        directory (once prepared: a task asked alone, by a test or a benchmark, keeps it)."""
        self.init_step = step
        if step is not None and self.primary and self.data_dir is not None:
            write_whole(self.data_dir / STARTED_FROM, json.dumps(
                {"init_from": self.cfg.task.init_from, "init_step": step}))

    def write_outputs_to(self, directory) -> None:
        """Write what this task outputs while training (evals.jsonl, analyses, predictions,
        a state cache) to `directory` instead of the run directory prepare was given."""
        self.run_dir = directory

    def initial_model(self, mesh, fresh):
        return None

    def model_ready(self, model) -> None:
        pass

    # What a run of several trials asks (trainer/trials.py, state.py): by default every trial
    # holds all of its arrays, its shapes follow from its config, and each trial is evaluated
    # alone (``evaluate`` of one model); a kind whose trials can do better says so.

    @staticmethod
    def share_shapes(tasks: list) -> None:
        pass

    @staticmethod
    def share_start(tasks: list) -> None:
        for t in tasks[1:]:
            if t.init_step is None and t.cfg.task.init_from == tasks[0].cfg.task.init_from:
                t.init_step = tasks[0].init_step

    def trial_shared(self, model):
        return None

    def evaluates_alike(self, tasks) -> bool:
        return False


def same_arrays(a, b) -> bool:
    """Whether two pytrees of arrays (evaluation batches, prompts) are equal, leaf for leaf;
    the same objects are equal at once."""
    if a is b:
        return True
    x, tx = jax.tree.flatten(a)
    y, ty = jax.tree.flatten(b)
    return tx == ty and all(u is v or (np.shape(u) == np.shape(v) and np.array_equal(u, v))
                            for u, v in zip(x, y))
