"""A stack of L layers of one kind, the depth of every model here.

The L layers are built with ``eqx.filter_vmap`` into ONE module whose array leaves carry a
leading layer axis L, and run with ``lax.scan`` over those weights (equinox's trick for
compiling a deep model once: partition into arrays and static parts, recombine in the body), so
compile time does not grow with depth. ``scan=False`` runs the same weights through a Python
loop instead; tests check both give the same numbers.
"""
from __future__ import annotations

from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

REMAT_POLICIES = {
    "full": None,  # save nothing inside a layer; recompute it all on the backward pass
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

# (layer, x, dropout key or None) -> the layer's output, of x's shape
ApplyFn = Callable[[eqx.Module, Array, Array | None], Array]


def init_stack(make_layer: Callable[[Array], eqx.Module], n: int, *, key: Array) -> eqx.Module:
    """n layers ``make_layer(key_i)``, key_i = split(key, n)[i], stacked on a leading axis."""
    return eqx.filter_vmap(make_layer)(jax.random.split(key, n))


def folded_keys(key: Array | None, n: int) -> Array | None:
    """Dropout keys fold_in(key, i) for layers i = 0..n-1: the encoders' derivation (ACT folds
    its iteration index the same way). The decoder splits its key instead; each keeps its own,
    so dropout masks, and with them trained weights, stay what they were."""
    if key is None:
        return None
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n, dtype=jnp.int32))


def run_stack(layers: eqx.Module, x: Array, apply: ApplyFn, *, keys: Array | None = None,
              scan: bool = True, remat: str = "none", unroll: int = 1,
              all_layers: bool = False) -> tuple[Array, Array | None]:
    """Run x through the stacked layers; (last output, every layer's output [L, ...] or None).

    keys: one dropout key per layer (a key array [L]) or None (no dropout). remat: "none",
    "full" (recompute each layer on the backward pass) or "dots" (keep its matmul outputs).
    unroll: layers per scan iteration.
    """
    params, static = eqx.partition(layers, eqx.is_array)

    def body(x, layer_xs):
        p, k = layer_xs
        x = apply(eqx.combine(p, static), x, k)
        return x, (x if all_layers else None)

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat])
    if scan:
        return jax.lax.scan(body, x, (params, keys), unroll=unroll)
    ys = []
    for i in range(jax.tree.leaves(params)[0].shape[0]):
        p_i = jax.tree.map(lambda a: a[i], params)
        x, y = body(x, (p_i, None if keys is None else keys[i]))
        ys.append(y)
    return x, (jnp.stack(ys) if all_layers else None)
