"""The BERT-style encoder: embeddings, then a stack of post-LN layers (models/stack.py).

``Encoder`` reproduces Hugging Face's BERT/RoBERTa forward pass, for pretrained backbones:
``Encoder(...)(tokens_BT, mask_BT) -> (h_BTD, states_LBTD)``, ``states_LBTD[-1] == h_BTD``, the
layer outputs the fusion modules read (docs/design.md §4). Its embeddings are a field, so
``models/act.py``'s ``UntiedEncoder`` is this encoder with ALBERT's. ``EncoderMLM`` adds BERT's
MLM head (HF ``cls.predictions``) for MLM pretraining.

As HF: the GELU (exact erf for ``hidden_act="gelu"``) and ``layer_norm_eps`` come from the
config, attention scales by 1/sqrt(head_dim) at run time, and a masked key gets probability
exactly 0 (HF's ``finfo.min`` logits underflow to the same 0). RoBERTa (``position_offset =
pad_id + 1``) numbers non-pad tokens from the offset and gives pads ``pad_id``, as HF's
``create_position_ids_from_input_ids``. Only the hidden dropouts apply (embeddings, attention
output, MLP output), not attention-probability dropout.
"""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .specs import EncoderConfig
from .backbone import Backbone
from .declared import OverEncoder
from .flops import module_flops
from .layers import (LayerNorm, MLMHead, PostLNLayer, bert_init, dropout, gather_positions,
                     split_or_none)
from .stack import folded_keys, init_stack, run_stack


def default_inputs(tokens_BT: Array, segments_BT: Array | None,
                   mask_BT: Array | None) -> tuple[Array, Array]:
    """Segments default to 0 and the mask to all-real; the mask comes back boolean."""
    segments_BT = jnp.zeros_like(tokens_BT) if segments_BT is None else segments_BT
    mask_BT = jnp.ones(tokens_BT.shape, bool) if mask_BT is None else mask_BT.astype(bool)
    return segments_BT, mask_BT


def norm_and_activation(cfg: EncoderConfig) -> dict:
    """What BERT and RoBERTa checkpoints vary in their layers and MLM head."""
    return {"eps": cfg.layer_norm_eps, "activation": cfg.activation}


def bert_layer(cfg: EncoderConfig, *, key: Array) -> PostLNLayer:
    """BERT/RoBERTa's post-LN layer."""
    return PostLNLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, **norm_and_activation(cfg), key=key)


class BertEmbeddings(eqx.Module):
    """word + position + token type embeddings (HF layout), LayerNorm, dropout."""
    AXES = {"word_VD": ("vocab", "norm"), "position_PD": ("norm", "norm"),
            "token_type_YD": ("norm", "norm")}

    word_VD: Array
    position_PD: Array
    token_type_YD: Array
    norm: LayerNorm
    position_offset: int = eqx.field(static=True)
    pad_id: int = eqx.field(static=True)

    def __init__(self, cfg: EncoderConfig, *, keys: tuple[Array, Array, Array]):
        # One key per table, as the encoder has always split its own key (initial weights stay).
        kw, kp, kt = keys
        self.word_VD = bert_init(kw, (cfg.vocab_size, cfg.d_model), jnp.float32)
        self.position_PD = bert_init(kp, (cfg.max_positions, cfg.d_model), jnp.float32)
        self.token_type_YD = bert_init(kt, (cfg.type_vocab_size, cfg.d_model), jnp.float32)
        self.norm = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.position_offset = cfg.position_offset
        self.pad_id = cfg.pad_id

    def position_ids(self, tokens_BT: Array) -> Array:
        T = tokens_BT.shape[1]
        if self.position_offset == 0:
            return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], tokens_BT.shape)
        not_pad = (tokens_BT != self.pad_id).astype(jnp.int32)
        run = jnp.cumsum(not_pad, axis=1) - 1 + self.position_offset
        return jnp.where(not_pad == 1, run, self.position_offset - 1).astype(jnp.int32)

    def __call__(self, tokens_BT: Array, token_types_BT: Array | None = None, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        T, P = tokens_BT.shape[1], self.position_PD.shape[0]
        if T > P - self.position_offset:
            raise ValueError(f"sequence length {T} exceeds the {P - self.position_offset} "
                             f"positions of the encoder (max_positions={P}, "
                             f"position_offset={self.position_offset})")
        if token_types_BT is None:
            token_types_BT = jnp.zeros(tokens_BT.shape, jnp.int32)
        x_BTD = (self.word_VD[tokens_BT] + self.position_PD[self.position_ids(tokens_BT)]
                 + self.token_type_YD[token_types_BT])
        return dropout(self.norm(x_BTD), rate, key)


class Encoder(Backbone):
    """Embeddings (``embed(tokens_BT, segments_BT, rate, key) -> x_BTD``), then L stacked
    post-LN layers. Built here with BERT/RoBERTa's embeddings; ``act.UntiedEncoder`` builds it
    with ALBERT's."""

    embed: eqx.Module  # BertEmbeddings here; act.ALBERTEmbeddings in UntiedEncoder
    layers: PostLNLayer  # every leaf has a leading layer axis L
    cfg: EncoderConfig = eqx.field(static=True)

    def __init__(self, cfg: EncoderConfig, *, key: Array):
        kw, kp, kt, kl = jax.random.split(key, 4)
        self.embed = BertEmbeddings(cfg, keys=(kw, kp, kt))
        self.layers = init_stack(lambda k: bert_layer(cfg, key=k), cfg.n_layers, key=kl)
        self.cfg = cfg

    @property
    def scan_layers(self) -> bool:
        return self.cfg.scan_layers

    def forward(self, tokens_BT: Array, segments_BT: Array | None = None,
                mask_BT: Array | None = None, *, key: Array | None = None,
                all_layers: bool = True) -> tuple[Array, Array | None]:
        """(h_BTD, states_LBTD or None): the last layer's output and, if asked, every layer's.
        Dropout is active iff a key is given."""
        segments_BT, mask_BT = default_inputs(tokens_BT, segments_BT, mask_BT)
        rate = self.dropout_rate
        k_emb, k_layers = split_or_none(key, 2)
        h0_BTD = self.embed(tokens_BT, segments_BT, rate, k_emb)
        return run_stack(self.layers, h0_BTD, lambda layer, h, k: layer(h, mask_BT, rate, k),
                         keys=folded_keys(k_layers, self.n_layer_states), scan=self.scan_layers,
                         remat="full" if self.cfg.remat else "none", all_layers=all_layers)

    def __call__(self, tokens_BT: Array, mask_BT: Array | None = None,
                 token_types_BT: Array | None = None, *,
                 key: Array | None = None) -> tuple[Array, Array]:
        """Returns (h_BTD, states_LBTD): the last layer's output and every layer's output."""
        return self.forward(tokens_BT, token_types_BT, mask_BT, key=key)

    # ------------------------------------------------------------------ as a Backbone

    def layer_states(self, tokens_BT: Array, segments_BT: Array | None = None,
                     mask_BT: Array | None = None, *, key: Array | None = None) -> Array:
        return self.forward(tokens_BT, segments_BT, mask_BT, key=key)[1]

    def post_ln_layer(self, *, key: Array) -> PostLNLayer:
        """A fresh layer like this encoder's own, for Base+n."""
        return bert_layer(self.cfg, key=key)


# ------------------------------------------------------------------------------ BERT MLM

def bert_mlm_head(cfg: EncoderConfig, *, key: Array) -> MLMHead:
    """A fresh BERT MLM head (cls.predictions) for an encoder of this config."""
    return MLMHead(cfg.d_model, cfg.d_model, cfg.vocab_size, **norm_and_activation(cfg), key=key)


class EncoderMLM(OverEncoder):
    """The model ``model.arch=encoder`` pretrains: Encoder + tied MLM head (no SOP/NSP head), HF
    ``BertForMaskedLM``'s layout. The head (``bert_mlm_head``) predicts only at the masked
    positions (``positions_BP``), as ALBERT's data pipeline supplies them
    (data/corpus/mlm_sop.py), so the vocabulary projection costs P rather than T rows."""

    encoder: Encoder
    head: MLMHead

    def __init__(self, encoder: Encoder, *, key: Array):
        self.encoder = encoder
        self.head = bert_mlm_head(encoder.cfg, key=key)

    def flops_per_token(self, seq_len: int) -> int:
        return module_flops(self, seq_len)

    def masked_logits(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array, *, key: Array | None = None) -> Array:
        h_BTD, _ = self.encoder.forward(tokens_BT, segments_BT, mask_BT, key=key, all_layers=False)
        return self.head(gather_positions(h_BTD, positions_BP), self.encoder.embed.word_VD)
