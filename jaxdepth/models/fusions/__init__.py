"""Layer-fusion methods as choices: one ``eqx.Module`` per method (``fusion.method``), one module
of this package each. The class is the module the method adds between the backbone and the
head, and says all the rest of the code asks of the method: its name, its place in tables, how
it is built on a backbone (``build``), the parameters it adds, what it reads of the backbone's
output (``INPUT``: ``Words`` or ``Sentence``, the one thing in which the methods differ outside
their own modules; ``FusedModel`` and the NER task's state cache ask it) and the fusion settings
that only it reads (``READS``). Nothing outside these modules compares a method's name. A
constant a method carries but never trains is ``Frozen`` (DWAtt's layer keys), which
``fusion_trainable`` keeps from the optimiser.

Every module of this package is imported here, so a new method is a new module: defining a
subclass with a ``NAME`` registers it (jaxdepth/choices.py).
"""
from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ...choices import Choices, Registered, import_all
from ..layers import gather_positions


class Frozen(eqx.Module):
    """A constant array carried in the model pytree but never trained (see ``fusion_trainable``)."""

    AXES = {"value": ("norm", "norm")}  # DWAtt's layer keys [L, 24]: replicated

    value: Array


def fusion_trainable(tree):
    """Filter spec for ``eqx.partition`` of any model: True for every floating array (or its
    abstract stand-in, to count parameters unallocated) but ``Frozen`` ones, so the optimiser
    never sees DWAtt's ``k_pos``: the forward's stop_gradient alone would still let AdamW's
    weight decay shrink it."""
    is_frozen = lambda x: isinstance(x, Frozen)  # noqa: E731
    return jax.tree.map(lambda x: False if is_frozen(x) else _is_float(x), tree,
                        is_leaf=is_frozen)


def _is_float(x) -> bool:
    """A floating array, or its abstract stand-in from ``eqx.filter_eval_shape``."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jnp.issubdtype(x.dtype, jnp.inexact)
    return eqx.is_inexact_array(x)


_METHODS: Choices[type["FusionMethod"]] = Choices("fusion method", "fusion.method",
                                                  order=lambda cls: cls.ORDER)


class Words:
    """A method that reads each word's own L layer outputs, [L, B, P, D] (or [L, B, T, D] at
    every position), and is called as ``method(z_LBPD)``; h at a word depends on that word's
    states alone."""

    PER_WORD = True  # so a batch can run at its words in use alone (FusedModel's n_active)

    @staticmethod
    def take(z_LBTD: Array, positions_BP: Array | None) -> Array:
        """What the method reads of the backbone's layer outputs: those at positions_BP."""
        return z_LBTD if positions_BP is None else gather_positions(z_LBTD, positions_BP[None])

    @staticmethod
    def h(method, z_LBPD: Array, mask_BT: Array | None, positions_BP: Array | None,
          rate, key: Array | None) -> Array:
        """h at positions_BP ([B, P, D]; every position when None) from ``take``'s states."""
        return method(z_LBPD)

    @staticmethod
    def rows(z_LBPD: Array) -> Array:
        """``take``'s states one row per sentence ([B, L, P, D]), to cache and batch."""
        return jnp.moveaxis(z_LBPD, 0, 1)

    @staticmethod
    def from_rows(states_BLPD: Array) -> Array:
        return jnp.moveaxis(states_BLPD, 1, 0)


class Sentence:
    """A method that reads the last layer's output at every position, [B, T, D], with the
    attention mask, and is called as ``method(z_BTD, mask_BT, rate, key)``: its layers attend
    over the sentence, so h is gathered at the wanted positions after fusing."""

    PER_WORD = False

    @staticmethod
    def take(z_LBTD: Array, positions_BP: Array | None) -> Array:
        return z_LBTD[-1]

    @staticmethod
    def h(method, z_BTD: Array, mask_BT: Array | None, positions_BP: Array | None,
          rate, key: Array | None) -> Array:
        """rate, key: the dropout of the layers it adds (the backbone's rate, when training)."""
        mask = jnp.ones(z_BTD.shape[:2], bool) if mask_BT is None else mask_BT.astype(bool)
        h_BTD = method(z_BTD, mask, rate, key)
        return h_BTD if positions_BP is None else gather_positions(h_BTD, positions_BP)

    @staticmethod
    def rows(z_BTD: Array) -> Array:
        return z_BTD

    @staticmethod
    def from_rows(states_BTD: Array) -> Array:
        return states_BTD


class FusionMethod(eqx.Module, Registered):
    """A layer-fusion method: the module it adds, called on its INPUT (see ``Words``,
    ``Sentence``)."""

    NAME: ClassVar[str]  # the value of fusion.method, and its label in tables (``label``)
    ORDER: ClassVar[int]  # place in the few-shot grid and its tables (baselines first)
    INPUT: ClassVar[type] = Words  # Words or Sentence
    REGISTRY: ClassVar[Choices] = _METHODS

    @classmethod
    def build(cls, backbone, n_extra: int, *, key: Array) -> "FusionMethod":
        """The method's module on ``backbone``: by default ``cls(L, d, key=key)`` over the
        backbone's L layer outputs of width d (n_extra: Base+n's n)."""
        return cls(backbone.n_layer_states, backbone.width, key=key)

    @property
    def attention_layers(self) -> int:
        """Attention layers the method adds (FLOPs per token count their T x T products)."""
        return 0

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


def check_layers(z_LBTD: Array, n_layers: int, d_model: int) -> None:
    """A ValueError unless z_LBTD holds n_layers layer outputs of width d_model."""
    if z_LBTD.ndim != 4 or z_LBTD.shape[0] != n_layers or z_LBTD.shape[-1] != d_model:
        raise ValueError(f"expected z_LBTD of shape [{n_layers}, B, T, {d_model}], "
                         f"got {tuple(z_LBTD.shape)}")


def own_settings(method: str, source) -> dict:
    """{field: value} of the fusion settings only ``method`` reads (its READS), taken from
    the attributes of the same names of ``source`` (a plan, parsed arguments)."""
    names = [s.partition(".")[2] for s in fusion_method(method).READS]
    return {n: getattr(source, n) for n in names}


# fusion_method(name): the method called ``name`` (a ConfigError naming fusion.method for any
# other); fusion_methods(): every method's name, in table order
fusion_method, fusion_methods = _METHODS, _METHODS.names

import_all(__name__, __path__)
