"""What the layer-fusion methods (models/fusions/, one module each) share about their
parameters: a constant carried in the model but never trained (``Frozen``: DWAtt's layer keys)
and the filter that keeps such constants from the optimiser (``fusion_trainable``)."""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array


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
