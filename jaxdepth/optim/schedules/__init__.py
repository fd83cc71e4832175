"""Learning-rate schedules as choices: one class per schedule (``optim.schedule``), in one
module of this package each, registered by being defined (jaxdepth/choices.py).

A schedule is a function of the optimizer step. By default it is a linear warmup from 0 to
the learning rate over ``optim.warmup_steps``, then the class's ``after_warmup`` from the
rate to ``rate * optim.min_lr_ratio`` at the run's last step; a schedule with its own warmup
overrides ``build``, and one with constraints on the other fields states them in ``check``.
Nothing outside these modules compares a schedule's name. This package imports nothing of
jaxdepth but errors.py and choices.py, so that config.py can validate against it.
"""
from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import optax

from ...choices import Choices, Registered, import_all


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


import_all(__name__, __path__)
