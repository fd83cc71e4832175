"""Warmup-stable-decay (Hägele et al. 2024, MiniCPM): after warmup the rate stays at its peak,
and only the last ``optim.decay_fraction`` of the run's steps decays it linearly to
rate * min_lr_ratio, so a run can be extended from any point of its stable phase and cooled
down later. The fraction, optim.decay_fraction, is read by this schedule alone (``READS``)."""
import optax

from ...fields import require
from . import Schedule


class WSD(Schedule):
    NAME = "wsd"
    READS = ("optim.decay_fraction",)

    @classmethod
    def check(cls, cfg) -> None:
        require(0.0 < cfg.decay_fraction <= 1.0, "optim.decay_fraction",
                f"must be in (0, 1], got {cfg.decay_fraction!r}")

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        # decay_steps: the steps after warmup; the cooldown is a fraction of the whole run,
        # at least one step and never reaching into the warmup
        total = cfg.warmup_steps + decay_steps
        cooldown = min(decay_steps, max(1, int(cfg.decay_fraction * total + 0.5)))
        return optax.join_schedules(
            [optax.constant_schedule(rate), optax.linear_schedule(rate, end, cooldown)],
            [decay_steps - cooldown])
