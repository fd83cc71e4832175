"""Prefix-LM fine-tuning of the decoder on a seq2seq task (task.name one of task_names.TASKS)."""
from ..errors import ConfigError
from ..task_names import FUSION_TASKS, PROBE_TASKS
from . import RunKind, moments


class PrefixLMFinetuning(RunKind):
    NAME, TASK = "prefix_lm", "prefix_lm:PrefixLMTask"
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
