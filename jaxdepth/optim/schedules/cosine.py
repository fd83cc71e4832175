"""Cosine decay to rate * min_lr_ratio at the last step (optax's, alpha = min_lr_ratio)."""
import optax

from . import Schedule


class Cosine(Schedule):
    NAME = "cosine"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.cosine_decay_schedule(rate, decay_steps, alpha=cfg.min_lr_ratio)
