"""MLM + SOP pretraining of the ALBERT family (model.arch act, albert or bert; no task.name):
ALBERT is the ACT layer iterated exactly M times, BERT unties the M layers."""
from ...errors import ConfigError
from . import CORPUS, GRAMMAR, MLM_EXAMPLES, RunKind, moments


class EncoderPretraining(RunKind):
    NAME, ORDER = "encoder_pretrain", 3
    READS = (*CORPUS, *GRAMMAR, *MLM_EXAMPLES)
    # Simoulin & Crabbe (ALBERT's): LAMB, warmup then linear decay to 0, weight decay 0.01,
    # clipping 1.0; warmup 100 steps at CPU scale (the paper's 3125 is act-base's preset).
    RECIPE = dict(name="lamb", lr=1.76e-3, schedule="linear", warmup_steps=100,
                  min_lr_ratio=0.0, weight_decay=0.01, clip_norm=1.0,
                  moments=moments(0.9, 0.999, 1e-6))

    @classmethod
    def claims(cls, cfg) -> bool:
        return cfg.arch.PRETRAINING == cls.NAME and not cfg.task.name

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.act.max_len < cfg.data.seq_len:
            raise ConfigError(f"act.max_len: {cfg.act.max_len} position embeddings cannot hold "
                              f"data.seq_len={cfg.data.seq_len}", field="act.max_len")

    @classmethod
    def options(cls, cfg) -> dict:
        arch = cfg.arch  # one of archs.py's ALBERTFamily
        return {"arch": arch.NAME, "untied": arch.UNTIED, "adaptive": arch.ADAPTIVE,
                "halting": arch.halting(cfg)}
