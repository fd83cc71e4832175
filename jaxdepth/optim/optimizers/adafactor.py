"""Adafactor with t5x's defaults: factored second moments, update clipping 1.0, decay 0.8, no
momentum, and a learning rate relative to each parameter's RMS. It reads none of b1, b2, eps."""
import optax

from . import Optimizer


class Adafactor(Optimizer):
    NAME = "adafactor"

    @classmethod
    def build(cls, cfg, rate, weight_decay, mask):
        # cfg's decay of 0 adds no term at all; a trial's (traced) value is always applied,
        # and a 0 there adds nothing either.
        rate_wd = (cfg.weight_decay or None) if weight_decay is None else weight_decay
        return optax.adafactor(rate, weight_decay_rate=rate_wd, weight_decay_mask=mask)
