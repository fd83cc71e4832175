"""Prefix-LM fine-tuning of the decoder on a seq2seq task (task.name one of task_names.TASKS)."""
from ...errors import ConfigError
from ..task_names import FUSION_TASKS, PROBE_TASKS
from . import FROM_PRETRAINED, RunKind, moments


class PrefixLMFinetuning(RunKind):
    NAME, ORDER = "prefix_lm", 1
    READS = ("model.z_loss", "model.xent_chunk", "task.dir", *FROM_PRETRAINED, "task.n_train",
             "task.n_eval", "task.seed", "task.dev_fraction", "task.eval_splits", "task.eval_max",
             "task.eval_batch", "task.truncate", "task.pack")
    # t5x fine-tuning (Petty et al.): Adafactor at a constant 1e-3, no warmup, no clipping.
    RECIPE = dict(name="adafactor", lr=1e-3, schedule="constant", warmup_steps=0,
                  min_lr_ratio=0.1, weight_decay=0.0, clip_norm=0.0,
                  moments=moments(0.9, 0.99, 1e-8))

    @classmethod
    def claims(cls, cfg) -> bool:
        name = cfg.task.name
        return cfg.arch.FINETUNING == cls.NAME and bool(name) and name not in FUSION_TASKS

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.task.name in PROBE_TASKS:
            raise ConfigError(f"task.name: {cfg.task.name!r} fine-tunes an encoder: set "
                              f"model.arch to act, albert or bert", field="task.name")
