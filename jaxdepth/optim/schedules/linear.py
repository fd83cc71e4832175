"""Linear decay to rate * min_lr_ratio at the last step (BERT, ALBERT, the DWAtt paper)."""
import optax

from . import Schedule


class Linear(Schedule):
    NAME = "linear"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.linear_schedule(rate, end, decay_steps)
