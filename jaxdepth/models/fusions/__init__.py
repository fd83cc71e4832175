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

import importlib
import pkgutil
from typing import ClassVar

import equinox as eqx
import jax
from jaxtyping import Array

from ...config import ConfigError
from ..fusion import fusion_trainable

_REGISTRY: dict[str, type["FusionMethod"]] = {}


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
            if cls.NAME in _REGISTRY:
                raise TypeError(f"fusion method {cls.NAME!r} is defined twice: "
                                f"{_REGISTRY[cls.NAME].__module__} and {cls.__module__}")
            _REGISTRY[cls.NAME] = cls

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
    if name not in _REGISTRY:
        raise ConfigError(f"fusion.method: must be one of {', '.join(fusion_methods())}, "
                          f"got {name!r}", field="fusion.method")
    return _REGISTRY[name]


def fusion_methods() -> tuple[str, ...]:
    """Every method's name, in table order."""
    return tuple(sorted(_REGISTRY, key=lambda n: (_REGISTRY[n].ORDER, n)))


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
