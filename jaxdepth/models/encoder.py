"""A BERT/RoBERTa encoder that reproduces Hugging Face's forward pass, for pretrained backbones.

The fusion modules (``models/fusion.py``, DESIGN §4) read the outputs of every layer, so the
encoder returns them all: ``Encoder(...)(tokens_BT, mask_BT) -> (h_BTD, states_LBTD)`` with
``states_LBTD[-1] == h_BTD`` (the embedding output is not included).

Differences from ``layers.PostLNEncoderLayer`` (ALBERT's layer, left unchanged for its callers):
that layer uses the tanh GELU and LayerNorm eps 1e-12 fixed; HF BERT/RoBERTa use the exact
(erf) GELU (``hidden_act="gelu"``) and ``layer_norm_eps`` from the config (RoBERTa: 1e-5). So the
layer here, ``BertLayer``, takes both as static options; it reuses ``BertSelfAttention`` (run-time
1/sqrt(head_dim) scaling, like HF) unchanged. Masked keys get probability exactly 0 here, whereas
HF adds ``finfo.min`` to their logits, which underflows to the same 0 after the softmax, so the
outputs agree (at every position, including padded queries, which attend to the real keys).

Positions: BERT uses ``0..T-1``. RoBERTa (``position_offset = pad_id + 1``) numbers non-pad
tokens ``offset, offset+1, ...`` by a running count and gives pad tokens ``pad_id``, exactly as
HF's ``create_position_ids_from_input_ids``. Attention-probability dropout is not applied (only
the hidden dropouts: embeddings, attention output, MLP output).

Layers are stacked (every leaf of ``Encoder.layers`` has a leading axis L) and run with
``lax.scan`` (``scan_layers=True``, the default) or a Python loop (``scan_layers=False``), same
numbers either way.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..layers import BertSelfAttention, Dense, LayerNorm, bert_init, dropout, split_or_none
from .options import with_options

ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "relu")
_SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions",
                 "type_vocab_size")


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_offset: int = 0  # RoBERTa: pad_id + 1 (= 2); BERT: 0
    pad_id: int = 0
    dropout: float = 0.1
    activation: str = "gelu"  # exact erf GELU (HF "gelu"); "gelu_new"/"gelu_tanh": tanh approx
    scan_layers: bool = True  # run-time option: lax.scan over the stacked layers, or unrolled
    remat: bool = False  # run-time option: rematerialise each layer in the backward pass

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions",
                     "type_vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"EncoderConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"EncoderConfig.d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"EncoderConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not isinstance(self.position_offset, int) or self.position_offset < 0:
            raise ValueError(f"EncoderConfig.position_offset must be an int >= 0, "
                             f"got {self.position_offset!r}")
        if self.position_offset >= self.max_positions:
            raise ValueError(f"EncoderConfig.position_offset={self.position_offset} leaves no "
                             f"positions (max_positions={self.max_positions})")
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"EncoderConfig.pad_id must be in [0, vocab_size), got {self.pad_id!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"EncoderConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"EncoderConfig.activation must be one of {ACTIVATIONS}, "
                             f"got {self.activation!r}")

    @property
    def max_len(self) -> int:
        """Longest sequence the position table allows."""
        return self.max_positions - self.position_offset

    def replace(self, **changes) -> "EncoderConfig":
        return dataclasses.replace(self, **changes)


def activation_fn(name: str):
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name in ("gelu_new", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


class BertLayer(eqx.Module):
    """HF BertLayer: h = LN(x + Attn(x)); out = LN(h + W2 act(W1 h)), LN eps and act configurable."""

    attn: BertSelfAttention
    attn_norm: LayerNorm
    ff_in: Dense
    ff_out: Dense
    ff_norm: LayerNorm
    activation: str = eqx.field(static=True, default="gelu")

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, eps: float = 1e-12,
                 activation: str = "gelu", key: Array):
        ka, ki, ko = jax.random.split(key, 3)
        self.attn = BertSelfAttention(d_model, n_heads, key=ka)
        self.attn_norm = LayerNorm(d_model, eps)
        self.ff_in = Dense(d_model, d_ff, key=ki)
        self.ff_out = Dense(d_ff, d_model, key=ko)
        self.ff_norm = LayerNorm(d_model, eps)
        self.activation = activation

    def __call__(self, x_BTD: Array, key_mask_BT: Array, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        k1, k2 = split_or_none(key, 2)
        h_BTD = self.attn_norm(x_BTD + dropout(self.attn(x_BTD, key_mask_BT), rate, k1))
        f_BTD = self.ff_out(activation_fn(self.activation)(self.ff_in(h_BTD)))
        return self.ff_norm(h_BTD + dropout(f_BTD, rate, k2))


class Encoder(eqx.Module):
    """Embeddings (word + position + token type, LayerNorm, dropout) then L stacked BertLayers."""

    word_VD: Array
    position_PD: Array
    token_type_YD: Array
    embed_norm: LayerNorm
    layers: BertLayer  # every leaf has a leading layer axis L
    cfg: EncoderConfig = eqx.field(static=True)

    def __init__(self, cfg: EncoderConfig, *, key: Array):
        kw, kp, kt, kl = jax.random.split(key, 4)
        self.word_VD = bert_init(kw, (cfg.vocab_size, cfg.d_model), jnp.float32)
        self.position_PD = bert_init(kp, (cfg.max_positions, cfg.d_model), jnp.float32)
        self.token_type_YD = bert_init(kt, (cfg.type_vocab_size, cfg.d_model), jnp.float32)
        self.embed_norm = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        make = lambda k: BertLayer(cfg.d_model, cfg.n_heads, cfg.d_ff,  # noqa: E731
                                   eps=cfg.layer_norm_eps, activation=cfg.activation, key=k)
        self.layers = eqx.filter_vmap(make)(jax.random.split(kl, cfg.n_layers))
        self.cfg = cfg

    def with_options(self, **changes) -> "Encoder":
        """Same weights, other run-time options (scan_layers, remat, dropout)."""
        return with_options(self, _SHAPE_FIELDS, **changes)

    def position_ids(self, tokens_BT: Array) -> Array:
        cfg = self.cfg
        T = tokens_BT.shape[1]
        if cfg.position_offset == 0:
            return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], tokens_BT.shape)
        not_pad = (tokens_BT != cfg.pad_id).astype(jnp.int32)
        run = jnp.cumsum(not_pad, axis=1) - 1 + cfg.position_offset
        return jnp.where(not_pad == 1, run, cfg.position_offset - 1).astype(jnp.int32)

    def embed(self, tokens_BT: Array, token_types_BT: Array | None = None, *,
              key: Array | None = None) -> Array:
        cfg = self.cfg
        T = tokens_BT.shape[1]
        if T > cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds the {cfg.max_len} positions of the "
                             f"encoder (max_positions={cfg.max_positions}, "
                             f"position_offset={cfg.position_offset})")
        if token_types_BT is None:
            token_types_BT = jnp.zeros(tokens_BT.shape, jnp.int32)
        x_BTD = (self.word_VD[tokens_BT] + self.position_PD[self.position_ids(tokens_BT)]
                 + self.token_type_YD[token_types_BT])
        return dropout(self.embed_norm(x_BTD), cfg.dropout, key)

    def __call__(self, tokens_BT: Array, mask_BT: Array | None = None,
                 token_types_BT: Array | None = None, *,
                 key: Array | None = None) -> tuple[Array, Array]:
        """Returns (h_BTD, states_LBTD): the last layer's output and every layer's output."""
        cfg = self.cfg
        if mask_BT is None:
            mask_BT = jnp.ones(tokens_BT.shape, bool)
        mask_BT = mask_BT.astype(bool)
        k_emb, k_layers = split_or_none(key, 2)
        h0 = self.embed(tokens_BT, token_types_BT, key=k_emb)
        params, static = eqx.partition(self.layers, eqx.is_array)

        def body(h, xs):
            p, n = xs
            k = None if k_layers is None else jax.random.fold_in(k_layers, n)
            h = eqx.combine(p, static)(h, mask_BT, cfg.dropout, k)
            return h, h

        if cfg.remat:
            body = jax.checkpoint(body)
        ns = jnp.arange(cfg.n_layers, dtype=jnp.int32)
        if cfg.scan_layers:
            h, states = jax.lax.scan(body, h0, (params, ns))
            return h, states
        h, outs = h0, []
        for i in range(cfg.n_layers):
            p_i = jax.tree.map(lambda x: x[i], params)
            h, _ = body(h, (p_i, ns[i]))
            outs.append(h)
        return h, jnp.stack(outs)
