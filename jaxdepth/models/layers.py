"""Building blocks shared by the models: norms, T5 relative position bias, attention, MLPs,
the decoder's pre-norm block, the encoders' post-LN layer and masked-LM head.

Shape suffixes: B batch, T query positions, S key positions, D d_model, N heads, H head dim,
F d_ff, V vocab. Parameters are float32; ``__call__`` runs in the dtype of its input.
"""
from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .attentions import attention_path
from .config import ModelConfig
from .specs import ACTIVATIONS
from .trial_tracing import Keep, may_drop

_NEG_INF = float(np.finfo(np.float32).min)
kernel_init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal")


def dropout(x: Array, rate: float | Keep, key: Array | None) -> Array:
    """Inverted dropout; identity when key is None (inference) or rate is 0. `rate` may be a
    trial's traced rate (trial_tracing.setting)."""
    if key is None or not may_drop(rate):
        return x
    p = rate.p if isinstance(rate, Keep) else 1.0 - rate
    keep = jax.random.bernoulli(key, p, x.shape)
    return jnp.where(keep, x / jnp.asarray(p, x.dtype), jnp.zeros((), x.dtype))


def split_or_none(key: Array | None, n: int) -> list:
    return [None] * n if key is None else list(jax.random.split(key, n))


class RMSNorm(eqx.Module):
    """x * rsqrt(mean(x^2) + eps) * scale, computed in float32 (T5 LayerNorm)."""
    AXES, NO_DECAY = {"scale": ("norm",)}, frozenset({"scale"})

    scale: Array
    eps: float = eqx.field(static=True, default=1e-6)

    def __init__(self, dim: int, eps: float = 1e-6):
        self.scale = jnp.ones((dim,), jnp.float32)
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
        scale = self.scale.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + (-1,))
        return (x32 * jax.lax.rsqrt(var + self.eps) * scale).astype(x.dtype)


class LayerNorm(eqx.Module):
    """(x - mean) * rsqrt(var + eps) * scale + bias over the last axis, in float32 (BERT/ALBERT)."""
    AXES, NO_DECAY = {"scale": ("norm",), "bias": ("norm",)}, frozenset({"scale", "bias"})

    scale: Array
    bias: Array
    eps: float = eqx.field(static=True, default=1e-12)

    def __init__(self, dim: int, eps: float = 1e-12):
        self.scale = jnp.ones((dim,), jnp.float32)
        self.bias = jnp.zeros((dim,), jnp.float32)
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        shape = (1,) * (x.ndim - 1) + (-1,)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale.reshape(shape) + self.bias.reshape(shape)).astype(x.dtype)


def relative_position_bucket(rel_pos: np.ndarray | Array, n_buckets: int, max_distance: int,
                             xp=jnp) -> Array:
    """T5's causal bucketing of ``rel_pos = key_pos - query_pos``.

    Distances n = max(query - key, 0) below n_buckets // 2 get their own bucket; larger ones share
    log-spaced buckets, saturating at n_buckets - 1 from max_distance on. Future keys (n = 0 after
    the clamp) fall in bucket 0 but are masked out by causality anyway.
    """
    n = xp.maximum(-rel_pos, 0)
    max_exact = n_buckets // 2
    # eps keeps log finite at n = 0, where the small branch is taken anyway (as in T5).
    nf = n.astype(xp.float32) / xp.float32(max_exact) + xp.float32(np.finfo(np.float32).eps)
    scale = xp.float32((n_buckets - max_exact) / math.log(max_distance / max_exact))
    large = max_exact + (xp.log(nf) * scale).astype(xp.int32)
    large = xp.minimum(large, n_buckets - 1)
    return xp.where(n < max_exact, n.astype(xp.int32), large)


class RelativePositionBias(eqx.Module):
    """One (n_buckets, n_heads) table shared by every layer."""
    AXES = {"table": ("buckets", "heads")}

    table: Array
    n_buckets: int = eqx.field(static=True)
    max_distance: int = eqx.field(static=True)

    def __init__(self, n_buckets: int, n_heads: int, max_distance: int, *, key: Array):
        init = jax.nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
        self.table = init(key, (n_buckets, n_heads), jnp.float32)
        self.n_buckets = n_buckets
        self.max_distance = max_distance

    def __call__(self, q_pos: Array, k_pos: Array) -> Array:
        """Bias for query positions [..., T] against key positions [S]: [..., N, T, S]."""
        rel = k_pos.reshape((1,) * q_pos.ndim + (-1,)) - q_pos[..., None]
        buckets = relative_position_bucket(rel, self.n_buckets, self.max_distance)
        return jnp.moveaxis(self.table[buckets], -1, -3)


def shared_bias(bias_NTS: Array, batch: int) -> Array:
    """The bias every example shares, broadcast to [B, N, T, S] (or [1, ...]) for the logits.

    Its gradient sums the examples'. On one CPU device shared_over_batch adds the B slices one
    after the other: jax 0.10's XLA:CPU gives the sum over the batch to YNNPACK, which is
    4-50x slower (measured on 2 cores: benchmarks/bench_batch_sum.py; 5% of the miniature
    sweep's one-thread fine-tuning step) and adds in an order that depends on the shape and
    the number of threads. Elsewhere jnp's broadcast and reduction (on a mesh the slices of
    a sharded batch would have to meet for the adds)."""
    if jax.default_backend() == "cpu" and jax.device_count() == 1:
        return shared_over_batch(bias_NTS, batch)
    return bias_NTS[None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def shared_over_batch(x: Array, batch: int) -> Array:
    """x repeated along a new leading axis [B, ...]; its gradient adds the B slices in order
    (vmapped trials too, so that each trial sums as a run of one does)."""
    return jnp.broadcast_to(x, (batch, *x.shape))


def _shared_fwd(x, batch):
    return shared_over_batch(x, batch), None


def _shared_bwd(batch, _, g_BX):
    acc = g_BX[0]
    for b in range(1, batch):
        acc = acc + g_BX[b]
    return (acc,)


shared_over_batch.defvjp(_shared_fwd, _shared_bwd)


def split_heads(y_BTX: Array, n_heads: int) -> Array:
    """[..., N*H] -> [..., N, H]."""
    return y_BTX.reshape(*y_BTX.shape[:-1], n_heads, -1)


def attend(q_BTNH: Array, k_BSNH: Array, v_BSNH: Array, mask_BNTS: Array, *,
           bias_BNTS: Array | None = None, scale: float | None = None) -> Array:
    """softmax(scale * q k^T + bias) v over the keys mask allows: the heads concatenated,
    [B, T, N*H], before any output projection. Logits and softmax run in float32.

    T5 folds 1/sqrt(H) into its query kernel and adds a position bias; BERT scales at run time
    and has no bias. A masked key gets probability exactly 0 (its logit is float32's minimum).
    ``mask_BNTS`` may be any shape that broadcasts to [B, N, T, S].
    """
    logits = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH, preferred_element_type=jnp.float32)
    if scale is not None:
        logits = logits * scale
    if bias_BNTS is not None:
        logits = logits + bias_BNTS.astype(jnp.float32)
    logits = jnp.where(mask_BNTS, logits, _NEG_INF)
    probs = jax.nn.softmax(logits, axis=-1).astype(v_BSNH.dtype)
    out_BTNH = jnp.einsum("bnts,bsnh->btnh", probs, v_BSNH)
    return out_BTNH.reshape(*out_BTNH.shape[:-2], -1)


def causal_attend(q_BTNH: Array, k_BTNH: Array, v_BTNH: Array, bias_NTT: Array, path, *,
                  mask_B1TT: Array | None = None) -> Array:
    """Causal ``softmax(q k^T + bias) v`` through ``jax.nn.dot_product_attention`` (T5: scale
    1, the 1/sqrt(H) lives in the query kernel); [B, T, N*H] like ``attend``. ``path``: the
    model.attention class (attentions.py), which says the kernel's ``implementation`` and the
    bias's dtype."""
    bias_dtype = q_BTNH.dtype if path.BIAS_IN_INPUT_DTYPE else jnp.float32
    # jax's own XLA path calls promote_types(bf16, float32), which strict promotion (the
    # tests' setting) refuses; every dtype here is already explicit. (Its backward, lowered
    # later with the whole step, does the same in jax 0.10: differentiate the bf16 path under
    # standard promotion, train.py's default.)
    with jax.numpy_dtype_promotion("standard"):
        out_BTNH = jax.nn.dot_product_attention(
            q_BTNH, k_BTNH, v_BTNH, bias=bias_NTT[None].astype(bias_dtype), mask=mask_B1TT,
            is_causal=True, scale=1.0, implementation=path.IMPLEMENTATION)
    return out_BTNH.reshape(*out_BTNH.shape[:-2], -1)


class Attention(eqx.Module):
    """Multi-head attention without biases; the query kernel carries the 1/sqrt(H) scale (t5x)."""
    AXES = {"wq": ("embed", "heads"), "wk": ("embed", "heads"), "wv": ("embed", "heads"),
            "wo": ("heads", "embed")}

    wq: Array  # [D, N*H]
    wk: Array
    wv: Array
    wo: Array  # [N*H, D]
    n_heads: int = eqx.field(static=True)

    def __init__(self, d_model: int, n_heads: int, *, key: Array):
        kq, kk, kv, ko = jax.random.split(key, 4)
        head_dim = d_model // n_heads
        self.wq = kernel_init(kq, (d_model, d_model), jnp.float32) / math.sqrt(head_dim)
        self.wk = kernel_init(kk, (d_model, d_model), jnp.float32)
        self.wv = kernel_init(kv, (d_model, d_model), jnp.float32)
        self.wo = kernel_init(ko, (d_model, d_model), jnp.float32)
        self.n_heads = n_heads

    def project_qkv(self, x_BTD: Array) -> tuple[Array, Array, Array]:
        n = self.n_heads
        return (split_heads(x_BTD @ self.wq, n), split_heads(x_BTD @ self.wk, n),
                split_heads(x_BTD @ self.wv, n))

    def attend(self, q_BTNH: Array, k_BSNH: Array, v_BSNH: Array, bias_BNTS: Array,
               mask_BNTS: Array) -> Array:
        """softmax(q k^T + bias) v over allowed keys, then the output projection."""
        return attend(q_BTNH, k_BSNH, v_BSNH, mask_BNTS, bias_BNTS=bias_BNTS) @ self.wo

    def __call__(self, x_BTD: Array, bias_NTT: Array, attention: str = "einsum",
                 segment_ids_BT: Array | None = None) -> Array:
        """Causal self-attention; ``attention`` is ModelConfig.attention. With packed
        documents (``segment_ids_BT``) a query sees only earlier keys of its own document."""
        q, k, v = self.project_qkv(x_BTD)
        same_doc = None if segment_ids_BT is None else same_segment_mask(segment_ids_BT)
        path = attention_path(attention)
        if path.JAX:
            return causal_attend(q, k, v, bias_NTT, path, mask_B1TT=same_doc) @ self.wo
        T = x_BTD.shape[1]
        causal = jnp.tril(jnp.ones((T, T), bool))[None, None]
        mask = causal if same_doc is None else causal & same_doc
        return self.attend(q, k, v, shared_bias(bias_NTT, x_BTD.shape[0]), mask)


def same_segment_mask(segment_ids_BT: Array) -> Array:
    """[B, 1, T, T]: key s is in query t's document. Inside one packed document positions
    advance by one per token, so k - q is the in-document relative distance and the unpacked
    T5 bias stays right for every pair this mask allows."""
    return (segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :])[:, None]


class GatedMLP(eqx.Module):
    """T5.1.1 gated-GELU MLP: wo(gelu(wi_0 x) * wi_1 x)."""
    AXES = {"wi_0": ("embed", "mlp"), "wi_1": ("embed", "mlp"), "wo": ("mlp", "embed")}

    wi_0: Array  # [D, F]
    wi_1: Array  # [D, F]
    wo: Array  # [F, D]
    d_ff: int = eqx.field(static=True)  # F of the model, which ``padded`` weights exceed

    def __init__(self, d_model: int, d_ff: int, *, key: Array):
        k0, k1, k2 = jax.random.split(key, 3)
        self.wi_0 = kernel_init(k0, (d_model, d_ff), jnp.float32)
        self.wi_1 = kernel_init(k1, (d_model, d_ff), jnp.float32)
        self.wo = kernel_init(k2, (d_ff, d_model), jnp.float32)
        self.d_ff = d_ff

    def __call__(self, x_BTD: Array, rate: float = 0.0, key: Array | None = None) -> Array:
        h_BTF = jax.nn.gelu(x_BTD @ self.wi_0, approximate=True) * (x_BTD @ self.wi_1)
        extra = h_BTF.shape[-1] - self.d_ff
        if extra and key is not None and may_drop(rate):
            # The unpadded model's mask (its shape fixes the random bits), so padded training
            # drops the same units; the padded units are zeros either way.
            kept = dropout(h_BTF[..., :self.d_ff], rate, key)
            return jnp.pad(kept, [(0, 0)] * (kept.ndim - 1) + [(0, extra)]) @ self.wo
        return dropout(h_BTF, rate, key) @ self.wo

    def padded(self, d_ff: int) -> "GatedMLP":
        """The same function computed d_ff wide: zero columns appended to wi_0 and wi_1, zero
        rows to wo (on stacked weights too: F is the last axis of wi, the second last of wo).

        Exact: a padded unit is gelu(0) * 0 = 0 and meets a zero row of wo, so it adds exact
        zeros, and dropout draws the unpadded mask (``__call__``). The gradient of the padding
        is a slice, so the stored weights, their gradients and the optimizer never see it."""
        extra = d_ff - self.wo.shape[-2]
        if extra == 0:
            return self

        def pad(w: Array, axis: int) -> Array:
            widths = [(0, 0)] * w.ndim
            widths[axis] = (0, extra)
            return jnp.pad(w, widths)

        return eqx.tree_at(lambda m: (m.wi_0, m.wi_1, m.wo), self,
                           (pad(self.wi_0, -1), pad(self.wi_1, -1), pad(self.wo, -2)))


class DecoderBlock(eqx.Module):
    """Pre-norm residual block: x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x))."""

    attn_norm: RMSNorm
    attn: Attention
    mlp_norm: RMSNorm
    mlp: GatedMLP

    def __init__(self, cfg: ModelConfig, *, key: Array):
        ka, km = jax.random.split(key)
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.heads, key=ka)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = GatedMLP(cfg.d_model, cfg.d_ff, key=km)

    def __call__(self, x_BTD: Array, bias_NTT: Array, rate: float = 0.0,
                 key: Array | None = None, attention: str = "einsum",
                 segment_ids_BT: Array | None = None) -> Array:
        k1, k2, k3 = split_or_none(key, 3)
        h_BTD = self.attn(self.attn_norm(x_BTD), bias_NTT, attention, segment_ids_BT)
        x_BTD = x_BTD + dropout(h_BTD, rate, k1)
        return x_BTD + dropout(self.mlp(self.mlp_norm(x_BTD), rate, k2), rate, k3)

    def decode(self, x_BTD: Array, bias_BNTS: Array, mask_BNTS: Array, k_cache_BSNH: Array,
               v_cache_BSNH: Array, pos_B: Array) -> tuple[Array, Array, Array]:
        """Block forward for T new tokens written at positions pos_B .. pos_B+T-1 of the cache.

        Always the einsum ``attend``, whatever ModelConfig.attention: rows sit at different
        positions, so the mask and bias are per example over the whole cache (not ``is_causal``
        over T x T), and a few new tokens per call leave a fused kernel little to win.
        """
        q, k, v = self.attn.project_qkv(self.attn_norm(x_BTD))
        write = jax.vmap(lambda c, new, p: jax.lax.dynamic_update_slice_in_dim(c, new, p, axis=0))
        k_cache_BSNH = write(k_cache_BSNH, k.astype(k_cache_BSNH.dtype), pos_B)
        v_cache_BSNH = write(v_cache_BSNH, v.astype(v_cache_BSNH.dtype), pos_B)
        h = self.attn.attend(q, k_cache_BSNH, v_cache_BSNH, bias_BNTS, mask_BNTS)
        x_BTD = x_BTD + h
        x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
        return x_BTD, k_cache_BSNH, v_cache_BSNH


# ---------------------------------------------------------------------------- BERT-style encoders

# BERT/ALBERT initialise every matrix and embedding from N(0, 0.02) truncated at two std devs.
bert_init = jax.nn.initializers.truncated_normal(0.02)


class Dense(eqx.Module):
    """Affine map x @ w + b with a zero-initialised bias (BERT's init unless told otherwise)."""

    w: Array  # [I, O]
    b: Array  # [O]
    # The logical axes of w and b, given by the module that creates this map (its role: an
    # attention or MLP projection is split over "model"; a small projection is replicated).
    axes: tuple[str, str] = eqx.field(static=True)
    bias_axes: tuple[str] = eqx.field(static=True)
    NO_DECAY = frozenset({"b"})

    def __init__(self, d_in: int, d_out: int, *, key: Array, init=bert_init,
                 axes: tuple[str, str] = ("norm", "norm"), bias_axes: tuple[str] = ("norm",)):
        self.w = init(key, (d_in, d_out), jnp.float32)
        self.b = jnp.zeros((d_out,), jnp.float32)
        self.axes, self.bias_axes = axes, bias_axes

    def axes_of(self, name: str) -> tuple[str, ...]:
        return {"w": self.axes, "b": self.bias_axes}[name]

    def __call__(self, x: Array) -> Array:
        b = self.b.astype(x.dtype).reshape((1,) * (x.ndim - 1) + (-1,))
        return x @ self.w.astype(x.dtype) + b


class BertSelfAttention(eqx.Module):
    """Bidirectional multi-head self-attention with biased projections and a key-padding mask.

    Logits are scaled by 1/sqrt(H) at run time (BERT), not folded into the query kernel (t5x).
    """

    q: Dense
    k: Dense
    v: Dense
    o: Dense
    n_heads: int = eqx.field(static=True)

    def __init__(self, d_model: int, n_heads: int, *, key: Array):
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.q, self.k, self.v = (Dense(d_model, d_model, key=k, axes=("embed", "heads"))
                                  for k in (kq, kk, kv))
        self.o = Dense(d_model, d_model, key=ko, axes=("heads", "embed"))
        self.n_heads = n_heads

    def __call__(self, x_BTD: Array, key_mask_BS: Array) -> Array:
        n = self.n_heads
        q_BTNH = split_heads(self.q(x_BTD), n)
        k_BSNH, v_BSNH = split_heads(self.k(x_BTD), n), split_heads(self.v(x_BTD), n)
        scale = 1.0 / math.sqrt(q_BTNH.shape[-1])
        return self.o(attend(q_BTNH, k_BSNH, v_BSNH, key_mask_BS[:, None, None, :], scale=scale))


def activation_fn(name: str):
    """HF's names: "gelu" is the exact (erf) GELU, "gelu_new"/"gelu_tanh" its tanh approximation
    (ALBERT's)."""
    if name == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if name in ("gelu_new", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


class PostLNLayer(eqx.Module):
    """BERT/ALBERT layer: h = LN(x + Attn(x)), out = LN(h + W2 act(W1 h)).

    The LayerNorm eps (in the norms) and the activation are options: HF BERT/RoBERTa take both
    from their config (RoBERTa: eps 1e-5; "gelu" is exact), ALBERT uses eps 1e-12 and "gelu_new".
    """

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
        self.ff_in = Dense(d_model, d_ff, key=ki, axes=("embed", "mlp"), bias_axes=("mlp",))
        self.ff_out = Dense(d_ff, d_model, key=ko, axes=("mlp", "embed"))
        self.ff_norm = LayerNorm(d_model, eps)
        self.activation = activation

    def __call__(self, x_BTD: Array, key_mask_BT: Array, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        k1, k2 = split_or_none(key, 2)
        h_BTD = self.attn_norm(x_BTD + dropout(self.attn(x_BTD, key_mask_BT), rate, k1))
        f_BTD = self.ff_out(activation_fn(self.activation)(self.ff_in(h_BTD)))
        return self.ff_norm(h_BTD + dropout(f_BTD, rate, k2))


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
