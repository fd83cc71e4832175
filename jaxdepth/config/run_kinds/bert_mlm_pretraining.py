"""MLM pretraining of the BERT encoder (model.arch encoder, no task.name), the backbone that
layer fusion is studied over."""
from ...errors import ConfigError
from ..task_names import FUSION_TASKS
from . import CORPUS, GRAMMAR, MLM_EXAMPLES, RunKind, moments


class BertMLMPretraining(RunKind):
    NAME, ORDER = "encoder_mlm", 4
    READS = (*CORPUS, *GRAMMAR, *MLM_EXAMPLES)
    # BERT's MLM pretraining: AdamW 1e-4, warmup then linear decay to 0, weight decay 0.01.
    RECIPE = dict(name="adamw", lr=1e-4, schedule="linear", warmup_steps=100,
                  min_lr_ratio=0.0, weight_decay=0.01, clip_norm=1.0,
                  moments=moments(0.9, 0.999, 1e-6))

    @classmethod
    def claims(cls, cfg) -> bool:
        # with any other task too, which check refuses: no kind fine-tunes it (Arch.FINETUNING)
        return cfg.arch.PRETRAINING == cls.NAME and cfg.task.name not in FUSION_TASKS

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.task.name:
            raise ConfigError(f"task.name: model.arch='encoder' pretrains with MLM (empty "
                              f"task.name) or is the backbone of {', '.join(FUSION_TASKS)}; "
                              f"got {cfg.task.name!r}", field="task.name")
