"""Layer fusion for NER over any backbone (task.name ner; docs/design.md §4): its shape comes
from task.init_from or the config."""
from ...errors import ConfigError
from . import FROM_PRETRAINED, RunKind, moments


class FusionNER(RunKind):
    NAME, ORDER = "ner", 5
    READS = ("task.dir", *FROM_PRETRAINED, "task.seed", "task.eval_max", "task.eval_batch",
             "task.n_shot", "fusion")
    # The DWAtt paper's fine-tuning: AdamW 5e-5, no warmup, linear decay to 0, weight decay
    # 0.01.
    RECIPE = dict(name="adamw", lr=5e-5, schedule="linear", warmup_steps=0, min_lr_ratio=0.0,
                  weight_decay=0.01, clip_norm=1.0, moments=moments(0.9, 0.999, 1e-8))

    @classmethod
    def claims(cls, cfg) -> bool:
        return cfg.task.name == cls.NAME

    @classmethod
    def check(cls, cfg) -> None:
        # Over task.init_from the backbone's shape and options are the source's (its
        # config.json, or a Hugging Face config): the model sections describe nothing here.
        if not cfg.task.init_from:
            return
        for section in ("model", "act"):
            for name in cfg.changed(section):
                raise ConfigError(f"{section}.{name}: a {cls.NAME} run over task.init_from "
                                  f"({cfg.task.init_from}) takes its backbone from there and "
                                  f"does not read it", field=f"{section}.{name}")

    @classmethod
    def recipe(cls, cfg) -> dict:
        # With a frozen backbone (fusion.mode fe) only a fresh fusion module and head train,
        # which 5e-5 barely moves in a few hundred steps: 1e-3 there.
        frozen = cfg.fusion.frozen_backbone
        return {**cls.RECIPE, "lr": 1e-3} if frozen else cls.RECIPE
