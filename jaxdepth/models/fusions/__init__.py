"""Layer-fusion methods as choices: one class per method, in one module of this package each.

A class holds everything about its method that the rest of the code asks: its name
(``fusion.method``), its label and place in tables, the module it adds (``build``), how
that module turns the backbone's states into ``h`` (``fuse``), whether it needs the whole
sentence (``WHOLE_SEQUENCE``: Base+n's layers attend over it; the others work word by word, so
a frozen backbone's states are cached per word), and the trainable parameters it adds.
Nothing outside these modules compares a method's name.

Every module of this package is imported here, so a new method is a new module: defining a
subclass with a ``NAME`` registers it (``__init_subclass__``).
"""
from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
from jaxtyping import Array

from ...choices import Choices, import_all
from ..fusion import fusion_trainable

_METHODS: Choices[type["FusionMethod"]] = Choices("fusion method", "fusion.method",
                                                  order=lambda cls: cls.ORDER)


class FusionMethod:
    """A layer-fusion method. Word-by-word methods (the default) get ``z`` = the L layer outputs
    at the wanted positions, [L, B, P, D]; a WHOLE_SEQUENCE method gets ``z`` = the last
    layer's output at every position, [B, T, D], with the attention mask."""

    NAME: ClassVar[str]  # the value of fusion.method, and its label in tables (``label``)
    ORDER: ClassVar[int]  # place in the few-shot grid and its tables (baselines first)
    WHOLE_SEQUENCE: ClassVar[bool] = False
    # The module the method adds, built as MODULE(L, d, key=...) over the backbone's L layer
    # outputs of width d; a method that needs more overrides ``build``.
    MODULE: ClassVar[type[eqx.Module] | None] = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "NAME" in cls.__dict__:
            _METHODS.add(cls)

    @classmethod
    def build(cls, backbone, n_extra: int, *, key: Array) -> eqx.Module | None:
        """The module this method adds on ``backbone`` (None: nothing)."""
        return cls.MODULE(backbone.n_layer_states, backbone.width, key=key)

    @classmethod
    def fuse(cls, module, z: Array, mask_BT: Array | None, rate: float,
             key: Array | None) -> Array:
        """h from the backbone's states (see the class docstring for ``z``): [B, P or T, D]."""
        return module(z)

    @classmethod
    def label(cls, n_extra: int) -> str:
        """The method as the parameter table names it: its name, with what a setting adds."""
        return cls.NAME

    @classmethod
    def param_count(cls, backbone, n_extra: int) -> int:
        """Trainable parameters the method adds on this backbone (the paper's Table 2)."""
        abstract = eqx.filter_eval_shape(cls.build, backbone, n_extra, key=jax.random.key(0))
        flags = jax.tree.leaves(fusion_trainable(abstract))
        leaves = jax.tree.leaves(abstract)
        return sum(int(x.size) for x, t in zip(leaves, flags) if t)


def fusion_method(name: str) -> type[FusionMethod]:
    """The method called ``name``; a ConfigError naming fusion.method for any other name."""
    return _METHODS(name)


def fusion_methods() -> tuple[str, ...]:
    """Every method's name, in table order."""
    return _METHODS.names()


import_all(__name__, __path__)
