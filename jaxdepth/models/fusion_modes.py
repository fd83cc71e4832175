"""What a fusion run does with its backbone (``fusion.mode``, docs/design.md §4.5), one class
per mode: feature extraction keeps it frozen, fine-tuning trains it with the rest.

A class holds what the rest of the code asks of a mode: whether the backbone stays frozen
(so it runs without dropout under stop_gradient, gets no optimizer moments, can be cached,
and a frozen backbone takes a higher learning rate in the recipe) and how tables name it.
Nothing outside this module compares a mode's name. It imports nothing of jaxdepth but
errors.py and choices.py, so that config.py can validate against it.
"""
from __future__ import annotations

from typing import ClassVar

from ..choices import Choices, Registered

_MODES: Choices[type["FusionMode"]] = Choices("fusion mode", "fusion.mode",
                                              order=lambda cls: cls.ORDER)


class FusionMode(Registered):
    NAME: ClassVar[str]  # the value of fusion.mode
    ORDER: ClassVar[int]  # place in the few-shot grid and its tables
    LABEL: ClassVar[str]  # as the tables and figures name it
    FROZEN_BACKBONE: ClassVar[bool]

    REGISTRY = _MODES


class FeatureExtraction(FusionMode):
    NAME, ORDER, LABEL = "fe", 0, "feature extraction (FE)"
    FROZEN_BACKBONE = True


class FineTuning(FusionMode):
    NAME, ORDER, LABEL = "ft", 1, "fine-tuning (FT)"
    FROZEN_BACKBONE = False


def fusion_mode(name: str) -> type[FusionMode]:
    """The mode called ``name``; a ConfigError naming fusion.mode for any other name."""
    return _MODES(name)


def fusion_modes() -> tuple[str, ...]:
    """Every mode's name, in table order."""
    return _MODES.names()
