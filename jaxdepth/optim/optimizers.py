"""The optimizers, one class each (``optim.name``). A class holds everything about its
optimizer: its name, the settings only some optimizers read (``OWN_FIELDS``) that it reads,
with its defaults for them (``DEFAULTS``, which join its ``READS``; config.optim.OptimConfig
refuses the others when they are set), and how optax builds it (``OPTAX``, called with those
settings, or ``build``). Defining a subclass with a ``NAME`` registers it; nothing outside this
module compares an optimizer's name. It imports nothing of jaxdepth but choices.py, so that
the config can validate against it."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import optax

from ..choices import Choices, Registered

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


def optimizer(name: str) -> type[Optimizer]:
    """The optimizer called ``name``; a ConfigError naming optim.name for any other name."""
    return OPTIMIZERS(name)


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
