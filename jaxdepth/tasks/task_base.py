"""What every task shares: defaults of the trainer's Task interface (trainer/task.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..config import Config
from ..models.fusion import fusion_trainable
from ..trainer.mfu import model_param_count
from ..trial_axis import Models


class TaskBase:
    """Defaults: no pretrained weights, every float array trains (a model may narrow that with
    ``trainable_spec``, e.g. a frozen FE backbone), parameters counted from the arrays.

    Each task also says what eval.py does with one of its checkpoints
    (``evaluate_checkpoint(run, request)``, reading the request's ``EVAL_READS``); what
    train.py prints of its summary is jaxdepth/summary_text.py's."""

    uses_dropout = False
    reports_perplexity = False
    init_step: int | None = None  # task.init_from's checkpoint step, once initial_model read it
    prepared: Any = None  # what prepare returned; None before it

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def prepare(self, run_dir: Path, primary: bool, barrier) -> Any:
        """The kind's ``read_data`` (its data as one frozen value of the type its module
        declares), kept as ``self.prepared`` for the later methods, the only state they read
        besides where the outputs go (``run_dir``, ``primary``; ``write_outputs_to``)."""
        self.run_dir, self.primary = run_dir, primary
        self.prepared = self.read_data(run_dir, primary, barrier)
        return self.prepared

    def trainable(self, model):
        spec = getattr(model, "trainable_spec", None)
        return spec() if spec is not None else fusion_trainable(model)

    def write_outputs_to(self, directory) -> None:
        """Write what this task outputs while training (evals.jsonl, analyses, predictions,
        a state cache) to `directory` instead of the run directory prepare was given."""
        self.run_dir = directory

    def share_shapes(self, tasks) -> None:
        pass  # its shapes follow from the config alone, the same for every trial

    def initial_model(self, mesh, fresh):
        return None

    def trial_shared(self, model):
        return None  # each trial holds all of its arrays

    def model_ready(self, model) -> None:
        pass

    def param_count(self, model) -> int:
        return model_param_count(model)

    # Evaluation. A kind that writes ``evaluate_all(models: Models, tasks, ...)`` (one list
    # entry per trial) evaluates a solo run through it and, when ``evaluates_alike`` says
    # its trials' evaluation inputs are the same, every trial in one vmapped pass; otherwise
    # (or for a kind that only writes ``evaluate_one``) trial by trial, sharing its programs.

    def evaluate_one(self, model, step: int, sharding, final: bool) -> tuple[dict, str]:
        """(metrics, one-line message) of one model at an evaluation point."""
        return self.evaluate_all(Models(model), [self], step, sharding, final)[0]

    def vmaps_evaluation(self, tasks) -> bool:
        # Decided once per run: the trials' evaluation inputs are fixed after prepare and
        # model_ready, and comparing them (whole validation sets) is not free.
        key = tuple(map(id, tasks))
        if getattr(self, "_vmaps", (None,))[0] != key:
            how = self.cfg.trials.evaluation
            vmaps = (how == "vmapped" or (how == "auto" and jax.default_backend() != "cpu")) \
                and hasattr(self, "evaluate_all") and self.evaluates_alike(tasks)
            self._vmaps = (key, vmaps)
        return self._vmaps[1]

    def evaluate(self, models, tasks, step: int, sharding, final: bool) -> list:
        if self.vmaps_evaluation(tasks):
            return self.evaluate_all(models, tasks, step, sharding, final)
        return [t.evaluate_one(models.one(k), step, sharding, final)
                for k, t in enumerate(tasks)]

    def evaluates_alike(self, tasks) -> bool:
        """Whether every trial's task evaluates on the same inputs as this one."""
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
