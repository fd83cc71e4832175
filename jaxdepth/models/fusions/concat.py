"""Concat: h = [z_1; ...; z_L] W + b = sum_n z_n W_n + b, one affine map from the L*d
concatenation of the layer outputs to d (docs/design.md §4.3)."""
import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from ..layers import Dense, kernel_init
from . import FusionMethod, check_layers


class Concat(FusionMethod):
    NAME, ORDER = "concat", 30

    proj: Dense  # [L*d, d]; rows n*d:(n+1)*d are W_n
    n_layers: int = eqx.field(static=True)
    d_model: int = eqx.field(static=True)

    def __init__(self, n_layers: int, d_model: int, *, key: Array):
        self.proj = Dense(n_layers * d_model, d_model, key=key, init=kernel_init)
        self.n_layers = n_layers
        self.d_model = d_model

    def __call__(self, z_LBTD: Array) -> Array:
        check_layers(z_LBTD, self.n_layers, self.d_model)
        L, B, T, D = z_LBTD.shape
        # [B, T, L*D] with layer n's features in block n, matching the row blocks of proj.w.
        z_BTX = jnp.moveaxis(z_LBTD, 0, 2).reshape(B, T, L * D)
        return self.proj(z_BTX)
