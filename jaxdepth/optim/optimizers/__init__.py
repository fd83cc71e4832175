"""Optimizers as choices: one class per optimizer (``optim.name``), in one module of this
package each.

A class holds everything about its optimizer: its name, which of the settings that only some
optimizers read (``OWN_FIELDS``: optim.b1, b2, eps) it reads and its defaults for them
(``DEFAULTS``, which are its ``READS``; config.optim.OptimConfig refuses the others when
they are set), and how it is built
from optax (``OPTAX``, called with those settings, or ``build``). Nothing outside these modules
compares an optimizer's name.

Every module of this package is imported here, so a new optimizer is a new module: defining a
subclass with a ``NAME`` registers it. This package imports nothing of jaxdepth but errors.py
and choices.py, so that config.py can validate against it.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import optax

from ...choices import Choices, Registered, import_all


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


import_all(__name__, __path__)
