"""A runtime check inside compiled code (``error_if``), as ``equinox.error_if`` but also
where each device computes on its own under ``jax.shard_map`` with ``check_vma``: there a
value that differs by device (its rows) is typed as varying, and equinox's failing branch
returns an invariant one, which the check refuses at trace time. As equinox's, the predicate
is reduced over any vmapped axis first (``unvmap_any``), so that the failing branch runs only
when some element fails, also under vmap (where a batched predicate would run both branches)."""
from __future__ import annotations

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array


def error_if(x: Array, pred: Array, msg: str) -> Array:
    """x, once `pred` (any element true) is false; else the computation fails with `msg`
    (raised on the host: a jax runtime error whose text ends with it)."""
    def raises(_):
        raise ValueError(msg)

    def fail():
        out = jax.pure_callback(raises, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                vmap_method="broadcast_all")
        return out + jnp.zeros_like(x)  # typed as x: varying over the devices x varies over

    return jax.lax.cond(eqxi.unvmap_any(jnp.any(pred)), fail, lambda: x)
