"""The optimizer of a config's optim section: its update rule (``optim.name``), its
learning-rate schedule (``optim.schedule``), the weight-decay mask and global-norm clipping.

Each optimizer and each schedule is a class, registered by being defined; nothing outside this
module compares their names. An optimizer holds its name, the settings only some optimizers
read (``OWN_FIELDS``) that it reads with its defaults for them (``DEFAULTS``, which join its
``READS``; config.optim.OptimConfig refuses the others when they are set), and how optax builds
it (``OPTAX``, or ``build``). A schedule is a linear warmup from 0 to the rate over
``optim.warmup_steps``, then its ``after_warmup`` from the rate to ``rate * optim.min_lr_ratio``
at the run's last step; one with its own warmup overrides ``build``, one with constraints on
other fields states them in ``check``. This module imports nothing of jaxdepth but the leaf
modules (choices, errors, fields), so that the config validates against it.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import optax

from .choices import Choices, Registered
from .errors import ConfigError
from .fields import require


# ----------------------------------------------------------------------------- optimizers

# The settings only some optimizers read: an optimizer's DEFAULTS names those it reads.
OWN_FIELDS = ("b1", "b2", "eps")

OPTIMIZERS: Choices[type["Optimizer"]] = Choices("optimizer", "optim.name")


class Optimizer(Registered):
    NAME: ClassVar[str]  # the value of optim.name
    # The OWN_FIELDS this optimizer reads, with its defaults for them (used where neither the
    # config nor the run kind's recipe sets one): they join its READS.
    DEFAULTS: ClassVar[dict[str, float]] = {}
    # optax's constructor, called as OPTAX(rate, <DEFAULTS' fields>, weight_decay=, mask=)
    OPTAX: ClassVar[Callable[..., optax.GradientTransformation] | None] = None
    REGISTRY = OPTIMIZERS

    @classmethod
    def defined(cls) -> None:
        unknown = set(cls.DEFAULTS) - set(OWN_FIELDS)
        if unknown:
            raise TypeError(f"optimizer {cls.NAME!r}: DEFAULTS names {sorted(unknown)}, "
                            f"not among {OWN_FIELDS}")
        if cls.OPTAX is None and cls.build.__func__ is Optimizer.build.__func__:
            raise TypeError(f"optimizer {cls.NAME!r} defines neither OPTAX nor build")
        cls.READS = (*cls.__dict__.get("READS", ()), *(f"optim.{f}" for f in cls.DEFAULTS))

    @classmethod
    def build(cls, cfg, rate: optax.Schedule, weight_decay: Any,
              mask) -> optax.GradientTransformation:
        """The optax transformation. rate: the learning-rate schedule; weight_decay: a trial's
        decay (a traced array) or None for cfg's; mask: which leaves decay."""
        return cls.OPTAX(rate, **{f: getattr(cfg, f) for f in cls.DEFAULTS},
                         weight_decay=cfg.weight_decay if weight_decay is None else weight_decay,
                         mask=mask)


class Adafactor(Optimizer):
    """t5x's defaults: factored second moments, update clipping 1.0, decay 0.8, no momentum,
    a learning rate relative to each parameter's RMS. It reads none of b1, b2, eps."""
    NAME = "adafactor"

    @classmethod
    def build(cls, cfg, rate, weight_decay, mask):
        # cfg's decay of 0 adds no term at all; a trial's (traced) value is always applied,
        # and a 0 there adds nothing either.
        rate_wd = (cfg.weight_decay or None) if weight_decay is None else weight_decay
        return optax.adafactor(rate, weight_decay_rate=rate_wd, weight_decay_mask=mask)


class AdamW(Optimizer):
    """Adam with weight decay decoupled from the gradient (Loshchilov & Hutter)."""
    NAME, DEFAULTS, OPTAX = "adamw", {"b1": 0.9, "b2": 0.999, "eps": 1e-8}, optax.adamw


class Lamb(Optimizer):
    """Adam's update scaled per layer by the trust ratio ||w|| / ||update|| (You et al.), as
    ALBERT (and so Simoulin & Crabbe) pretrain with."""
    NAME, DEFAULTS, OPTAX = "lamb", {"b1": 0.9, "b2": 0.999, "eps": 1e-6}, optax.lamb


class Lion(Optimizer):
    """u = sign(b1 m + (1 - b1) g), then m <- b2 m + (1 - b2) g, with decoupled weight decay
    (Chen et al. 2023). Every coordinate moves by the learning rate, so Lion's rate is 3-10x
    smaller than AdamW's and its weight decay as much larger (the paper's advice); no eps."""
    NAME, DEFAULTS, OPTAX = "lion", {"b1": 0.9, "b2": 0.99}, optax.lion


# ----------------------------------------------------------------------------- schedules

SCHEDULES: Choices[type["Schedule"]] = Choices("schedule", "optim.schedule")


class Schedule(Registered):
    NAME: ClassVar[str]  # the value of optim.schedule
    REGISTRY = SCHEDULES

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


# ----------------------------------------------------------------- the optimizer of a config

def schedule(cfg, total_steps: int, lr=None) -> optax.Schedule:
    """Learning rate as a function of the optimizer step: cfg's schedule class
    (above); lr: in place of cfg.lr, e.g. a trial's, traced under vmap
    (trainer/trials.py)."""
    return SCHEDULES(cfg.schedule).build(cfg, total_steps, cfg.lr if lr is None else lr)


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """tx, with init/update traced under jax's standard dtype promotion.

    optax mixes Python floats with the int32 step count (e.g. ``1 - b1 ** count``), which the
    strict promotion mode turned on by the tests (and by careful users) rejects.
    """
    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg, total_steps: int, lr=None,
                   weight_decay=None) -> optax.GradientTransformation:
    """cfg's optimizer; lr / weight_decay: in place of cfg's (a trial's values, which may be
    traced arrays: the state's layout does not depend on them). Weight decay applies where the
    model declares it (models/declared.py: not on norm scales nor on biases)."""
    opt = OPTIMIZERS(cfg.name).build(cfg, schedule(cfg, total_steps, lr), weight_decay,
                                     lambda params: params.decay_mask())
    if cfg.clip_norm > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    return _standard_promotion(opt)
