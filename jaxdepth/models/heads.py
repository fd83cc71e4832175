"""The masked-LM head of BERT and ALBERT, and the gather of the positions it predicts."""
from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array

from .layers import Dense, LayerNorm, activation_fn


def gather_positions(x_BTD: Array, positions_BP: Array) -> Array:
    """x at the given positions of every row: [B, P, D] (works on [L, B, T, D] with axis 1 too)."""
    return jnp.take_along_axis(x_BTD, positions_BP[..., None], axis=-2)


class MLMHead(eqx.Module):
    """dense d_model -> X, activation, LayerNorm, then the TIED input embedding (X -> vocab) plus
    an output bias; no vocab-sized matrix of its own. BERT: X = d_model, its config's activation
    and eps (HF ``cls.predictions``); ALBERT: X = the factorised embedding size E, "gelu_new"."""
    AXES, NO_DECAY = {"bias_V": ("vocab",)}, frozenset({"bias_V"})

    dense: Dense  # d_model -> X
    norm: LayerNorm  # over X
    bias_V: Array
    activation: str = eqx.field(static=True, default="gelu")

    def __init__(self, d_model: int, d_out: int, vocab_size: int, *, eps: float = 1e-12,
                 activation: str = "gelu", key: Array):
        self.dense = Dense(d_model, d_out, key=key)
        self.norm = LayerNorm(d_out, eps)
        self.bias_V = jnp.zeros((vocab_size,), jnp.float32)
        self.activation = activation

    def __call__(self, h_BPD: Array, table_VX: Array) -> Array:
        """float32 logits [B, P, V]; table_VX is the tied input embedding table."""
        x_BPX = self.norm(activation_fn(self.activation)(self.dense(h_BPD)))
        logits = jnp.einsum("bpx,vx->bpv", x_BPX, table_VX.astype(x_BPX.dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.bias_V[None, None]
