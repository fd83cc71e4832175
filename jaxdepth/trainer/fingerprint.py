"""A checksum of every array of a train state, saved with each checkpoint and checked on restore.

Orbax's files carry no checksum of their own (TensorStore's zstd frames are written without
one), so a flipped bit in a checkpoint can restore as a different, often finite, number and
a run would go on from a corrupted state. Each array's fingerprint is
``sum_i bits_i * (2 i + 1) mod 2**32`` over its elements' bit patterns, computed on the
devices: any single changed bit changes it (the multiplier is odd), as does moving a value
to another position, and it does not depend on how the array is sharded.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _bits(x: jax.Array) -> jax.Array:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32).ravel()
    return jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32).ravel()


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    out = []
    for x in leaves:
        bits = _bits(x)
        weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
        out.append(jnp.sum(bits * weights, dtype=jnp.uint32))
    return out


def fingerprints(tree) -> dict[str, int]:
    """Dotted path of every array leaf of `tree` -> its fingerprint (one device sync)."""
    paths, leaves = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array):
            paths.append(jax.tree_util.keystr(path))
            leaves.append(leaf)
    # Each value is replicated; a process reads its own copy (on several hosts the global
    # array is not addressable as a whole).
    return {p: int(np.asarray(v.addressable_data(0))) for p, v in zip(paths, _fingerprints(leaves))}


def mismatches(tree, saved: dict[str, int]) -> list[str]:
    """Paths of the array leaves of `tree` whose fingerprint differs from the saved one
    (leaves the saved record lacks are not checked)."""
    now = fingerprints(tree)
    return [p for p, v in now.items() if p in saved and saved[p] != v]
