"""MLM on top of the BERT/RoBERTa encoder of models/encoder.py (HF ``BertForMaskedLM`` layout).

The head is BERT's ``cls.predictions``: dense d -> d, activation, LayerNorm, then the output
projection tied to the word embeddings plus a vocabulary bias. Logits are taken only at the
masked positions (``positions_BP``), as ALBERT's data pipeline supplies them (data/mlm.py), so
the vocabulary projection costs P rather than T rows per sequence.
"""
from __future__ import annotations

import equinox as eqx

import jax.numpy as jnp
from jaxtyping import Array

from ..layers import Dense, LayerNorm
from .encoder import Encoder, activation_fn


def gather_positions(x_BTD: Array, positions_BP: Array) -> Array:
    """x at the given positions of every row: [B, P, D] (works on [L, B, T, D] with axis 1 too)."""
    return jnp.take_along_axis(x_BTD, positions_BP[..., None], axis=-2)


class BertMLMHead(eqx.Module):
    dense: Dense  # d -> d
    norm: LayerNorm
    bias_V: Array
    activation: str = eqx.field(static=True, default="gelu")

    def __init__(self, d_model: int, vocab_size: int, *, eps: float = 1e-12,
                 activation: str = "gelu", key: Array):
        self.dense = Dense(d_model, d_model, key=key)
        self.norm = LayerNorm(d_model, eps)
        self.bias_V = jnp.zeros((vocab_size,), jnp.float32)
        self.activation = activation

    def __call__(self, h_BPD: Array, word_VD: Array) -> Array:
        """float32 logits [B, P, V]; word_VD is the (tied) input embedding table."""
        x = self.norm(activation_fn(self.activation)(self.dense(h_BPD)))
        logits = jnp.einsum("bpd,vd->bpv", x, word_VD.astype(x.dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.bias_V[None, None, :]


class EncoderMLM(eqx.Module):
    """The model ``model.arch=encoder`` pretrains: Encoder + tied MLM head (no SOP/NSP head)."""

    encoder: Encoder
    head: BertMLMHead

    def __init__(self, encoder: Encoder, *, key: Array):
        c = encoder.cfg
        self.encoder = encoder
        self.head = BertMLMHead(c.d_model, c.vocab_size, eps=c.layer_norm_eps,
                                activation=c.activation, key=key)

    @property
    def cfg(self):
        return self.encoder.cfg

    def masked_logits(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array, *, key: Array | None = None) -> Array:
        h_BTD, _ = self.encoder(tokens_BT, mask_BT, segments_BT, key=key)
        return self.head(gather_positions(h_BTD, positions_BP), self.encoder.word_VD)


