"""Warmup-stable-decay (Hägele et al. 2024, MiniCPM): after warmup the rate stays at its peak,
and only the last ``optim.decay_fraction`` of the run's steps decays it linearly to
rate * min_lr_ratio, so a run can be extended from any point of its stable phase and cooled
down later. The fraction is a setting of this schedule's own (``FIELDS``: config.optim.OptimConfig
gets it from here)."""
import optax

from ...fields import Setting
from . import Schedule


class WSD(Schedule):
    NAME = "wsd"
    FIELDS = {"decay_fraction": Setting(
        0.2, "wsd: the share of run.steps (warmup included) that its final linear decay takes "
        "(Hägele et al.'s 20% cooldown)", check=lambda v: 0.0 < v <= 1.0,
        must="must be in (0, 1]")}

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        # decay_steps: the steps after warmup; the cooldown is a fraction of the whole run,
        # at least one step and never reaching into the warmup
        total = cfg.warmup_steps + decay_steps
        cooldown = min(decay_steps, max(1, int(cfg.decay_fraction * total + 0.5)))
        return optax.join_schedules(
            [optax.constant_schedule(rate), optax.linear_schedule(rate, end, cooldown)],
            [decay_steps - cooldown])
