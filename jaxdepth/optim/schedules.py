"""The learning-rate schedules, one class each (``optim.schedule``), registered by being
defined; nothing outside this module compares a schedule's name. A schedule is a function of
the optimizer step: by default a linear warmup from 0 to the rate over ``optim.warmup_steps``,
then the class's ``after_warmup`` from the rate to ``rate * optim.min_lr_ratio`` at the run's
last step; a schedule with its own warmup overrides ``build``, and one with constraints on the
other fields states them in ``check``. It imports nothing of jaxdepth but choices.py, errors.py
and fields.py, so that the config can validate against it."""
from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from ..choices import Choices, Registered
from ..errors import ConfigError
from ..fields import require

_SCHEDULES: Choices[type["Schedule"]] = Choices("schedule", "optim.schedule")


class Schedule(Registered):
    NAME: ClassVar[str]  # the value of optim.schedule
    REGISTRY = _SCHEDULES

    @classmethod
    def defined(cls) -> None:
        # after_warmup(cfg, rate, end, decay_steps): the schedule from the end of warmup,
        # from rate to end over decay_steps; a schedule with its own warmup overrides build.
        if not hasattr(cls, "after_warmup") and cls.build.__func__ is Schedule.build.__func__:
            raise TypeError(f"schedule {cls.NAME!r} defines neither after_warmup nor build")

    @classmethod
    def build(cls, cfg, total_steps: int, rate: Any) -> optax.Schedule:
        """The learning rate at each step; rate: cfg.lr or a trial's (a traced array)."""
        after = cls.after_warmup(cfg, rate, rate * cfg.min_lr_ratio,
                                 max(total_steps - cfg.warmup_steps, 1))
        if cfg.warmup_steps > 0:
            warm = optax.linear_schedule(0.0, rate, cfg.warmup_steps)
            after = optax.join_schedules([warm, after], [cfg.warmup_steps])
        # The step is taken as float32: optax's cosine schedule mixes an int32 step with
        # Python floats, which strict dtype promotion rejects outside make_optimizer.
        return lambda step: after(jnp.asarray(step, jnp.float32))

    @classmethod
    def check(cls, cfg) -> None:
        """Refuse (ConfigError naming the field) settings this schedule cannot run with."""


def schedule_class(name: str) -> type[Schedule]:
    """The schedule called ``name``; a ConfigError naming optim.schedule for any other."""
    return _SCHEDULES(name)


class Constant(Schedule):
    """Constant after warmup (t5x fine-tuning: 1e-3, no warmup)."""
    NAME = "constant"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.constant_schedule(rate)


class Cosine(Schedule):
    """Cosine decay to rate * min_lr_ratio at the last step (optax's, alpha = min_lr_ratio)."""
    NAME = "cosine"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.cosine_decay_schedule(rate, decay_steps, alpha=cfg.min_lr_ratio)


class Linear(Schedule):
    """Linear decay to rate * min_lr_ratio at the last step (BERT, ALBERT, the DWAtt paper)."""
    NAME = "linear"

    @classmethod
    def after_warmup(cls, cfg, rate, end, decay_steps):
        return optax.linear_schedule(rate, end, decay_steps)


class Rsqrt(Schedule):
    """t5x's inverse square root, ``rate / sqrt(max(step, warmup_steps))``: the max() is its
    warmup (with rate 1 and 10k steps, 0.01 for 10k steps, then decaying); min_lr_ratio
    unused."""
    NAME = "rsqrt"

    @classmethod
    def build(cls, cfg, total_steps, rate):
        return lambda step: rate * jax.lax.rsqrt(
            jnp.maximum(jnp.asarray(step, jnp.float32), float(cfg.warmup_steps)))

    @classmethod
    def check(cls, cfg):
        if cfg.warmup_steps <= 0:
            raise ConfigError("optim.warmup_steps: rsqrt needs warmup_steps > 0 (t5x uses "
                              "10000)", field="optim.warmup_steps")


class WSD(Schedule):
    """Warmup-stable-decay (Hägele et al. 2024, MiniCPM): after warmup the rate stays at its
    peak, and only the last ``optim.decay_fraction`` of the run's steps decays it linearly to
    rate * min_lr_ratio, so a run can be extended from any point of its stable phase and
    cooled down later. optim.decay_fraction is read by this schedule alone (``READS``)."""
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
