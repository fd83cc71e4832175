"""Warmup-stable-decay (Hägele et al. 2024, MiniCPM): after warmup the rate stays at its peak,
and only the last DECAY_FRACTION of the run's steps decays it linearly to rate * min_lr_ratio,
so a run can be extended from any point of its stable phase and cooled down later.

The fraction is a constant of this class, not a setting: the schedule registry gives a choice
no fields of its own (a new optim field is an edit of config.OptimConfig)."""
import optax

from . import Schedule


class WSD(Schedule):
    NAME = "wsd"
    DECAY_FRACTION = 0.2  # of run.steps, warmup included (Hägele et al.'s 20% cooldown)

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        # decay_steps: the steps after warmup; the cooldown is a fraction of the whole run,
        # at least one step and never reaching into the warmup
        total = cfg.warmup_steps + decay_steps
        cooldown = min(decay_steps, max(1, int(cls.DECAY_FRACTION * total + 0.5)))
        return optax.join_schedules(
            [optax.constant_schedule(rate), optax.linear_schedule(rate, end, cooldown)],
            [decay_steps - cooldown])
