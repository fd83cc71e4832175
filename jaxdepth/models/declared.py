"""What each parameter is, declared by the module that creates it: its logical axes (the
names the sharding rules map to mesh axes, trainer/sharding.py:RULES) and whether weight
decay applies to it. The trainer reads them from the model (``Declared``) and names no
parameter itself.

A module declares, for each array field it creates, ``AXES[field]`` (a module whose arrays
play different roles per instance, as Dense, answers ``axes_of(field)`` instead) and lists
the fields that never decay in ``NO_DECAY`` (norm scales and biases, biases: BERT / ALBERT
practice). An array stacked along a leading layer (or trial-free scan) axis has one more
dimension than its axes: that one is "layers".
"""
from __future__ import annotations

from typing import Any, ClassVar

import equinox as eqx
import jax
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from .fusions import fusion_trainable


def _owner(root: Any, path: tuple) -> tuple[Any, str]:
    """The module holding the leaf at ``path`` and the leaf's field name."""
    node = root
    for k in path[:-1]:
        if isinstance(k, GetAttrKey):
            node = getattr(node, k.name)
        elif isinstance(k, SequenceKey):
            node = node[k.idx]
        elif isinstance(k, DictKey):
            node = node[k.key]
    last = path[-1]
    if not isinstance(last, GetAttrKey):
        raise TypeError(f"a parameter at {jax.tree_util.keystr(path)} is not a module's field")
    return node, last.name


def _axes_of(module: Any, name: str) -> tuple[str, ...]:
    if hasattr(module, "axes_of"):
        return module.axes_of(name)
    table = getattr(type(module), "AXES", {})
    if name not in table:
        raise TypeError(f"{type(module).__module__}.{type(module).__name__} declares no logical "
                        f"axes for its parameter {name!r} (its AXES)")
    return table[name]


def logical_axes(tree: Any) -> Any:
    """A pytree with ``tree``'s array leaves replaced by their logical axes (tuples); arrays
    or their abstract stand-ins alike."""
    def one(path, leaf):
        owner, name = _owner(tree, path)
        axes = tuple(_axes_of(owner, name))
        extra = leaf.ndim - len(axes)
        if extra not in (0, 1):
            raise TypeError(f"{jax.tree_util.keystr(path)}: shape {leaf.shape} does not fit its "
                            f"declared axes {axes} (with at most one leading layer axis)")
        return ("layers",) * extra + axes
    return jax.tree_util.tree_map_with_path(one, tree)


def decay_mask(tree: Any) -> Any:
    """A pytree of bools like ``tree``: whether weight decay applies to each parameter."""
    def one(path, leaf):
        owner, name = _owner(tree, path)
        return name not in getattr(type(owner), "NO_DECAY", frozenset())
    return jax.tree_util.tree_map_with_path(one, tree)


class Declared(eqx.Module):
    """A whole model (what a task trains): the trainer asks it for its parameters' logical
    axes and weight-decay mask, and what only the model knows of its training: which arrays
    train, whether it has dropout and its parameter count (a model class answers where these
    defaults do not hold), and its training FLOPs per token, which has no default: every
    class a task trains states its own ``flops_per_token(seq_len)`` (formulas in
    models/flops.py; a backbone only ever trained inside another model, the BERT Encoder,
    has none). Works on the model's filtered, partitioned or abstract trees too, which keep
    its classes."""

    AXES: ClassVar[dict[str, tuple[str, ...]]] = {}
    NO_DECAY: ClassVar[frozenset[str]] = frozenset()
    # whether a training step draws dropout keys for it (a Backbone: its rate above 0)
    uses_dropout: ClassVar[bool] = False

    def trainable_spec(self) -> Any:
        """Filter spec of the arrays the optimiser updates: every float array but the
        ``Frozen`` ones (a model that freezes more says so, e.g. a FE backbone)."""
        return fusion_trainable(self)

    def param_count(self) -> int:
        """Its parameter count (summary.json, MFU): the elements of its arrays."""
        return sum(int(x.size) for x in jax.tree.leaves(eqx.filter(self, eqx.is_array)))

    def logical_axes(self) -> Any:
        return logical_axes(self)

    def decay_mask(self) -> Any:
        return decay_mask(self)


class OverEncoder(Declared):
    """A model over an encoder (its ``encoder``), whose config and dropout are the encoder's."""

    encoder: eqx.AbstractVar[Any]

    @property
    def cfg(self):
        return self.encoder.cfg

    @property
    def uses_dropout(self) -> bool:
        return self.encoder.uses_dropout
