"""DWAtt, depth-wise attention (docs/design.md §4.2): each position attends over its own L
layer outputs with a single head and no 1/sqrt(d) scaling. Keys come from fixed random "layer
position" vectors, values from per-layer bottleneck MLPs, the query from the last layer.

Every linear map here is affine (weight and bias): the paper's equations only say "affine" for
W_K, and the bottleneck maps U and W get biases too, as usual for added heads (docs/design.md
§4.6 counts them). Parameters are float32 and are cast to the dtype of the input, so a bf16
backbone stays bf16 under strict dtype promotion; the softmax over layers always runs in
float32. The key positions ``k_pos`` are constants, not parameters: wrapped in ``Frozen``,
read through ``stop_gradient`` and left out of the trainable partition by
``fusion_trainable`` (models/fusions/__init__.py).
"""
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..layers import Dense, LayerNorm, kernel_init
from . import FusionMethod, Frozen, check_layers

KEY_DIM = 24  # size of DWAtt's random layer-position vectors (docs/design.md §4)


class Bottleneck(eqx.Module):
    """f(x) = W · LN(gelu(U x)) with U: d -> d/2 and W: d/2 -> d, both affine."""

    up: Dense  # U, d -> d // 2 (named for the paper's U, although it narrows)
    norm: LayerNorm  # over d // 2
    down: Dense  # W, d // 2 -> d

    def __init__(self, d_model: int, *, key: Array):
        ku, kw = jax.random.split(key)
        d_mid = d_model // 2
        self.up = Dense(d_model, d_mid, key=ku, init=kernel_init)
        self.norm = LayerNorm(d_mid)
        self.down = Dense(d_mid, d_model, key=kw, init=kernel_init)

    def __call__(self, x_BTD: Array) -> Array:
        # Exact (erf) gelu: the paper names no approximation.
        return self.down(self.norm(jax.nn.gelu(self.up(x_BTD), approximate=False)))


class ValueProj(eqx.Module):
    """v_n = LN_n(f_V_n(z_n)); DWAtt stacks L of these on a leading axis."""

    f: Bottleneck
    norm: LayerNorm  # LN_n over d

    def __init__(self, d_model: int, *, key: Array):
        self.f = Bottleneck(d_model, key=key)
        self.norm = LayerNorm(d_model)

    def __call__(self, z_BTD: Array) -> Array:
        return self.norm(self.f(z_BTD))


class DWAtt(FusionMethod):
    NAME, ORDER = "dwatt", 40

    k_pos: Frozen  # [L, 24] ~ U(0, 1), drawn once, never trained
    key_proj: Dense  # W_K, 24 -> d
    values: ValueProj  # every leaf has a leading layer axis L: f_V_n and LN_n per layer
    query: Bottleneck  # f_Q
    n_layers: int = eqx.field(static=True)
    d_model: int = eqx.field(static=True)

    def __init__(self, n_layers: int, d_model: int, *, key: Array, key_dim: int = KEY_DIM):
        kp, kk, kv, kq = jax.random.split(key, 4)
        self.k_pos = Frozen(jax.random.uniform(kp, (n_layers, key_dim), jnp.float32))
        self.key_proj = Dense(key_dim, d_model, key=kk, init=kernel_init)
        layer_keys = jax.random.split(kv, n_layers)
        self.values = eqx.filter_vmap(lambda k: ValueProj(d_model, key=k))(layer_keys)
        self.query = Bottleneck(d_model, key=kq)
        self.n_layers = n_layers
        self.d_model = d_model

    def _logits(self, z_LBTD: Array) -> Array:
        """q · k_n for every position and layer, float32 [B, T, L]."""
        check_layers(z_LBTD, self.n_layers, self.d_model)
        z_BTD = z_LBTD[-1]
        q_BTD = 1.0 + jax.nn.elu(z_BTD + self.query(z_BTD))
        k_pos_LK = jax.lax.stop_gradient(self.k_pos.value).astype(z_BTD.dtype)
        k_LD = self.key_proj(k_pos_LK)
        return jnp.einsum("btd,ld->btl", q_BTD, k_LD, preferred_element_type=jnp.float32)

    def attention_weights(self, z_LBTD: Array) -> Array:
        """alpha [B, T, L], float32: softmax over layers of q · k_n (for analysis)."""
        return jax.nn.softmax(self._logits(z_LBTD), axis=-1)

    def __call__(self, z_LBTD: Array) -> Array:
        alpha_BTL = self.attention_weights(z_LBTD).astype(z_LBTD.dtype)
        v_LBTD = eqx.filter_vmap(lambda proj, z: proj(z))(self.values, z_LBTD)
        return z_LBTD[-1] + jnp.einsum("btl,lbtd->btd", alpha_BTL, v_LBTD)
