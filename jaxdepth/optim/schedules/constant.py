"""Constant after warmup (t5x fine-tuning: 1e-3, no warmup)."""
import optax

from . import Schedule


class Constant(Schedule):
    NAME = "constant"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.constant_schedule(rate)
