"""ScalarMix (Peters et al. 2018, ELMo): h = γ Σ_n softmax(s)_n z_n, one learned weight per
layer and one scale, shared by every position: the standard layer-fusion baseline that few-shot
papers compare DWAtt-like methods against. As in AllenNLP's ScalarMix, s starts at 0 (an equal
mix) and γ at 1; the softmax runs in float32 and the mix in the states' dtype."""
import jax
import jax.numpy as jnp
from jaxtyping import Array

from . import FusionMethod


class ScalarMix(FusionMethod):
    NAME, ORDER = "scalar_mix", 25
    AXES = {"s": ("norm",), "gamma": ()}

    s: Array  # [L] float32, the layer logits
    gamma: Array  # [] float32

    def __init__(self, n_layers: int, d_model: int, *, key: Array):
        del d_model, key  # the weights do not depend on the width, and start deterministic
        self.s = jnp.zeros((n_layers,), jnp.float32)
        self.gamma = jnp.ones((), jnp.float32)

    def __call__(self, z_LBTD: Array) -> Array:
        if z_LBTD.shape[0] != self.s.shape[0]:
            raise ValueError(f"expected {self.s.shape[0]} layer outputs, got {z_LBTD.shape[0]}")
        w_L = (self.gamma * jax.nn.softmax(self.s)).astype(z_LBTD.dtype)
        return jnp.einsum("l,lbtd->btd", w_L, z_LBTD)
