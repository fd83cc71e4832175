"""Analytic training FLOPs per token of the models (the trainer turns them into MFU against
the device peak, trainer/metrics.py).

FLOPs convention (PaLM, Chowdhery et al. 2022, App. B): one training token costs
``6 * N + 12 * L * T * d_attn`` FLOPs, where N counts the parameters that take part in matrix
multiplies (every layer's attention and MLP matrices plus the output projection; the input
embedding is a lookup and the norms/position bias are negligible), L is the number of layers
and T the context length. The attention term counts the full T x T score and value products
(no discount for the causal mask), as PaLM does. Forward only is a third of that.
"""
from __future__ import annotations

import equinox as eqx
import jax

from .config import ModelConfig
from .depth_family import layer_constants


def matmul_params(m: ModelConfig) -> int:
    """Eq. 1's per-layer count without the two RMSNorm scales (no matmul), plus the output
    projection."""
    beta, a = layer_constants(m.d_model)
    return m.n_layers * (beta * m.d_ff + a - 2 * m.d_model) + m.d_model * m.vocab_size


def train_flops_per_token(m: ModelConfig, seq_len: int) -> int:
    return 6 * matmul_params(m) + 12 * m.n_layers * seq_len * m.d_model


_TABLES = ("word_VD", "position_PD", "token_type_YD", "embed", "token_VE", "position_LE",
           "segment_SE", "value")  # gathered, not multiplied (value: DWAtt's frozen keys)


def module_flops_per_token(model, trainable_spec, seq_len: int, attn_layers: int,
                           d_model: int) -> int:
    """Training FLOPs per token of a fusion model or the BERT encoder, same convention as the
    decoder's: a weight matrix costs 2 FLOPs per entry forward and twice that backward; only
    trained matrices pay the backward (a frozen FE backbone runs forward only); attention adds
    4·T·d forward per layer (QK^T and AV), times 3 when its layer trains. Embedding tables and
    the MLM vocabulary projection (taken at the few masked slots only) are left out."""
    def matrix_entries(tree) -> int:
        return sum(int(leaf.size) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
                   if leaf.ndim >= 2 and getattr(path[-1], "name", "") not in _TABLES)

    trained, frozen = eqx.partition(eqx.filter(model, eqx.is_array), trainable_spec)
    backbone_trained = any(jax.tree.leaves(getattr(trainable_spec, "backbone", trainable_spec)))
    return (6 * matrix_entries(trained) + 2 * matrix_entries(frozen)
            + (12 if backbone_trained else 4) * seq_len * d_model * attn_layers)


def module_flops(model, seq_len: int) -> int:
    """Training FLOPs per token of a fusion model or the BERT encoder (what trains from its
    ``trainable_spec``; its depth and width from its backbone's)."""
    from .backbone import depth_and_width, strip_to_backbone
    L, d = depth_and_width(strip_to_backbone(model))
    fusion = getattr(model, "fusion", None)  # the BERT encoder has none
    extra = 0 if fusion is None else fusion.attention_layers
    return module_flops_per_token(model, model.trainable_spec(), seq_len, L + extra, d)
