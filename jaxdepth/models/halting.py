"""How the tokens of the ALBERT-family encoder stop iterating (``act.halting``,
docs/design.md §3.2, §3.5), one class each: adaptively, each token once its cumulative
halting probability passes 1 - eps, at a ponder cost (ACT); or never, every token running the
shared layer exactly M times (weight-tied ALBERT).

What the encoder (models/act.py) asks of a halting is whether it is ``ADAPTIVE``: then it runs
the halting recurrence and pays the ponder term, else the fixed-depth loop. Nothing outside
this module compares a halting's name. It imports nothing of jaxdepth but choices.py, so that
config.py can validate against it (and hand it on to the models, which import only config).
"""
from __future__ import annotations

from typing import ClassVar

from ..choices import Choices, Registered

_HALTINGS: Choices[type["Halting"]] = Choices("halting", "act.halting",
                                              order=lambda cls: cls.ORDER)


class Halting(Registered):
    NAME: ClassVar[str]  # the value of act.halting
    ORDER: ClassVar[int]
    ADAPTIVE: ClassVar[bool]

    REGISTRY = _HALTINGS


class Adaptive(Halting):
    NAME, ORDER, ADAPTIVE = "act", 0, True


class FixedDepth(Halting):
    NAME, ORDER, ADAPTIVE = "fixed", 1, False


def halting(name: str) -> type[Halting]:
    """The halting called ``name``; a ConfigError naming act.halting for any other name."""
    return _HALTINGS(name)
