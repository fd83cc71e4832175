"""What every task shares: defaults of the trainer's Task interface (trainer/task.py)."""
from __future__ import annotations

from ..config import Config
from ..models.fusion import fusion_trainable
from ..trainer.mfu import model_param_count


class TaskBase:
    """Defaults: no pretrained weights, every float array trains (a model may narrow that with
    ``trainable_spec``, e.g. a frozen FE backbone), parameters counted from the arrays.

    Each registered task also says what train.py prints at the end (``report(summary)``) and
    what eval.py does with one of its checkpoints (``evaluate_checkpoint(run, request)``,
    reading the request's ``EVAL_READS``)."""

    uses_dropout = False
    reports_perplexity = False

    def __init__(self, cfg: Config):
        self.cfg = cfg

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

    def model_ready(self, model) -> None:
        pass

    def param_count(self, model) -> int:
        return model_param_count(model)
