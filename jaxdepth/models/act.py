"""Weight-tied ALBERT encoder with per-token adaptive depth (ACT), Simoulin & Crabbé 2021.

One shared post-LN layer is applied up to ``max_iters`` times. After each application every
token still running draws a halting probability from the layer output and is interpolated
towards it (docs/design.md §3, the semantics of the authors' released code):

    h_hat = layer(h[n-1]);  p = sigmoid(w_h . h_hat + b_h);  run = c < 1
    new_halted = run & (c + p > 1 - eps);  still_running = run & (c + p <= 1 - eps)
    c += p * still_running;  R += new_halted * (1 - c);  c += new_halted * R
    N += still_running + new_halted;  lam = p * still_running + R * new_halted
    h[n] = lam * h_hat + (1 - lam) * h[n-1]

The recurrence lives in ``halting_step`` and is driven by ``halting_scan`` (training: reverse-mode
differentiable, always M iterations; halted tokens no longer change, so it is exact) or
``halting_while`` (inference: stops once no token runs). Both take the per-iteration computation
as a function, so tests can inject it and the model reuses them unchanged.

``UntiedEncoder`` is the BERT-style baseline with M separate layers and the same embeddings and
heads, for fixed-depth comparisons: models/encoder.py's ``Encoder`` with ALBERT's embeddings.
``halting="fixed"`` is the weight-tied one (ALBERT). ``EncoderClassifier`` puts either under a
classification head for the probing tasks.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .act_config import ACT_PRESETS as PRESETS, ACTConfig  # noqa: F401  (act.PRESETS)
from .trial_tracing import setting
from .backbone import Backbone
from .declared import OverEncoder
from .encoder import Encoder, default_inputs
from .layers import (Dense, LayerNorm, MLMHead, PostLNLayer, bert_init, dropout,
                     gather_positions, split_or_none)
from .stack import init_stack


# ------------------------------------------------------------------------------- the recurrence

class HaltState(NamedTuple):
    h_BTD: Array
    c_BT: Array  # cumulative halting probability; exactly 1 once halted
    R_BT: Array  # remainder, set once, at the iteration a token halts
    N_BT: Array  # number of updates (float, no gradient)


class ACTOutput(NamedTuple):
    h_BTD: Array
    N_BT: Array
    R_BT: Array
    states_MBTD: Array | None  # h after iterations 1..M; after the last one run, repeated
    iterations_run: Array  # int32 scalar: iterations in which some token ran (= max N)


def init_halt_state(h0_BTD: Array, mask_BT: Array) -> HaltState:
    """Padding starts halted (c = 1), so it never updates and keeps N = R = 0."""
    real = mask_BT.astype(jnp.float32)
    zeros = jnp.zeros_like(real)
    return HaltState(h0_BTD, 1.0 - real, zeros, zeros)


def halting_step(state: HaltState, h_hat_BTD: Array, p_BT: Array,
                 eps: float) -> tuple[HaltState, Array]:
    """One ACT update (docs/design.md §3, line for line); returns the new state and lam [B, T].

    c + (1 - c) rounds to exactly 1 in float32 for any c in [0, 1), so ``run = c < 1`` is a
    reliable halted flag and no separate boolean has to be carried.
    """
    c, R, N = state.c_BT, state.R_BT, state.N_BT
    p = p_BT.astype(jnp.float32)
    run = c < 1.0
    new_halted = (run & (c + p > 1.0 - eps)).astype(jnp.float32)
    still_running = (run & (c + p <= 1.0 - eps)).astype(jnp.float32)
    c = c + p * still_running
    R = R + new_halted * (1.0 - c)
    c = c + new_halted * R
    # N only counts; the ponder gradient must flow through R alone.
    N = jax.lax.stop_gradient(N + still_running + new_halted)
    lam = p * still_running + R * new_halted
    lam_BT1 = lam.astype(state.h_BTD.dtype)[..., None]
    h_BTD = lam_BT1 * h_hat_BTD + (1.0 - lam_BT1) * state.h_BTD
    return HaltState(h_BTD, c, R, N), lam


StepFn = Callable[[Array, Array], tuple[Array, Array]]  # (n, h_BTD) -> (h_hat_BTD, p_BT)


def _iterations(N_BT: Array) -> Array:
    return jnp.max(N_BT, initial=0.0).astype(jnp.int32)


def halting_scan(step_fn: StepFn, h0_BTD: Array, mask_BT: Array, max_iters: int, eps: float, *,
                 return_states: bool = False, remat: bool = False) -> ACTOutput:
    """Exactly M iterations under ``lax.scan``; halted tokens get lam = 0 and stay put."""

    def body(state, n):
        h_hat, p = step_fn(n, state.h_BTD)
        state, _ = halting_step(state, h_hat, p, eps)
        return state, (state.h_BTD if return_states else None)

    if remat:
        body = jax.checkpoint(body)
    state, states = jax.lax.scan(body, init_halt_state(h0_BTD, mask_BT),
                                 jnp.arange(max_iters, dtype=jnp.int32))
    return ACTOutput(state.h_BTD, state.N_BT, state.R_BT, states, _iterations(state.N_BT))


def halting_while(step_fn: StepFn, h0_BTD: Array, mask_BT: Array, max_iters: int, eps: float, *,
                  return_states: bool = False) -> ACTOutput:
    """Iterate only while some token of the batch still runs (and at most M times).

    Not reverse-mode differentiable (``lax.while_loop``); use ``halting_scan`` to train.
    """
    state0 = init_halt_state(h0_BTD, mask_BT)
    # made like h0, so typed like it under shard_map (varying over the devices it varies over)
    buf0 = jnp.zeros_like(h0_BTD, shape=(max_iters,) + h0_BTD.shape) if return_states else None

    def cond(carry):
        n, state, _ = carry
        return (n < max_iters) & jnp.any(state.c_BT < 1.0)

    def body(carry):
        n, state, buf = carry
        h_hat, p = step_fn(n, state.h_BTD)
        state, _ = halting_step(state, h_hat, p, eps)
        if buf is not None:
            buf = jax.lax.dynamic_update_index_in_dim(buf, state.h_BTD, n, axis=0)
        return n + 1, state, buf

    n, state, buf = jax.lax.while_loop(cond, body, (jnp.int32(0), state0, buf0))
    if buf is not None:
        # Iterations not run would have left every state unchanged: fill them with the last one.
        ran_M = jnp.arange(max_iters) < n
        buf = jnp.where(ran_M[:, None, None, None], buf, state.h_BTD[None])
    return ACTOutput(state.h_BTD, state.N_BT, state.R_BT, buf, n)


# ------------------------------------------------------------------------ embeddings and heads

class ALBERTEmbeddings(eqx.Module):
    """token + position + segment embeddings of size E, LayerNorm, dropout, then E -> d_model."""
    AXES = {"token_VE": ("vocab", "norm"), "position_LE": ("norm", "norm"),
            "segment_SE": ("norm", "norm")}

    token_VE: Array
    position_LE: Array
    segment_SE: Array
    norm: LayerNorm
    proj: Dense

    def __init__(self, cfg: ACTConfig, *, key: Array):
        kt, kp, ks, kj = jax.random.split(key, 4)
        self.token_VE = bert_init(kt, (cfg.vocab_size, cfg.embed_dim), jnp.float32)
        self.position_LE = bert_init(kp, (cfg.max_len, cfg.embed_dim), jnp.float32)
        self.segment_SE = bert_init(ks, (cfg.n_segments, cfg.embed_dim), jnp.float32)
        self.norm = LayerNorm(cfg.embed_dim)
        self.proj = Dense(cfg.embed_dim, cfg.d_model, key=kj)

    def __call__(self, tokens_BT: Array, segments_BT: Array, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        T = tokens_BT.shape[1]
        if T > self.position_LE.shape[0]:
            raise ValueError(f"sequence length {T} exceeds act.max_len={self.position_LE.shape[0]}")
        x_BTE = self.token_VE[tokens_BT] + self.position_LE[:T][None] + self.segment_SE[segments_BT]
        return self.proj(dropout(self.norm(x_BTE), rate, key))


def albert_layer(cfg: ACTConfig, *, key: Array) -> PostLNLayer:
    """ALBERT's post-LN layer: tanh GELU ("gelu_new"), LayerNorm eps 1e-12."""
    return PostLNLayer(cfg.d_model, cfg.n_heads, cfg.ff, activation="gelu_new", key=key)


def albert_mlm_head(cfg: ACTConfig, *, key: Array) -> MLMHead:
    """ALBERT's MLM head: d_model -> E, tanh GELU, LayerNorm, then the tied token embedding."""
    return MLMHead(cfg.d_model, cfg.embed_dim, cfg.vocab_size, activation="gelu_new", key=key)


class SOPHead(eqx.Module):
    """Pooler (dense + tanh on [CLS], position 0), then a linear map to 2 classes."""

    pooler: Dense
    classifier: Dense

    def __init__(self, cfg: ACTConfig, *, key: Array):
        kp, kc = jax.random.split(key)
        self.pooler = Dense(cfg.d_model, cfg.d_model, key=kp)
        self.classifier = Dense(cfg.d_model, 2, key=kc)

    def __call__(self, h_BTD: Array, rate: float = 0.0, key: Array | None = None) -> Array:
        pooled_BD = jnp.tanh(self.pooler(h_BTD[:, 0]))
        return self.classifier(dropout(pooled_BD, rate, key)).astype(jnp.float32)


class _Pretrainable(Backbone):
    """Heads, run-time options and the Backbone methods shared by ACTEncoder and UntiedEncoder
    (no fields of its own)."""

    dropout_setting = "act.dropout"

    def mlm_logits(self, h_BTD: Array, positions_BP: Array) -> Array:
        """Float32 logits [B, P, V] at the given positions."""
        return self.mlm(gather_positions(h_BTD, positions_BP), self.embed.token_VE)

    def sop_logits(self, h_BTD: Array, *, key: Array | None = None) -> Array:
        return self.sop(h_BTD, self.dropout_rate, key)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (PaLM convention, as the decoder): 6 x matmul parameters
        each iteration + 12 x T x d attention, times the M iterations the training scan always
        runs, plus the embedding projection; the MLM head (on <= max_predictions tokens) is
        left out."""
        a = self.cfg
        per_iter = 6 * (4 * a.d_model * a.d_model + 2 * a.d_model * a.ff) + 12 * seq_len * a.d_model
        return a.max_iters * per_iter + 6 * a.embed_dim * a.d_model

    @property
    def n_layer_states(self) -> int:
        """M: the states after each iteration (ACT: a halted token's state stays as it was)."""
        return self.cfg.max_iters

    def layer_states(self, tokens_BT: Array, segments_BT: Array | None = None,
                     mask_BT: Array | None = None, *, key: Array | None = None) -> Array:
        return self(tokens_BT, segments_BT, mask_BT, key=key, return_states=True).states_MBTD

    def post_ln_layer(self, *, key: Array) -> PostLNLayer:
        """A fresh layer for Base+n: the encoder's own (ALBERT's tanh GELU, eps 1e-12)."""
        return albert_layer(self.cfg, key=key)


# ----------------------------------------------------------------------------------- ACT model

class ACTEncoder(_Pretrainable):
    AXES, NO_DECAY = {"halt_w_D": ("norm",), "halt_b": ()}, frozenset({"halt_b"})
    embed: ALBERTEmbeddings
    layer: PostLNLayer  # the one shared layer
    halt_w_D: Array
    halt_b: Array  # scalar
    mlm: MLMHead
    sop: SOPHead
    cfg: ACTConfig = eqx.field(static=True)

    def __init__(self, cfg: ACTConfig, *, key: Array):
        ke, kl, kh, km, ks = jax.random.split(key, 5)
        self.embed = ALBERTEmbeddings(cfg, key=ke)
        self.layer = albert_layer(cfg, key=kl)
        self.halt_w_D = bert_init(kh, (cfg.d_model,), jnp.float32)
        self.halt_b = jnp.asarray(cfg.halting_bias_init, jnp.float32)
        self.mlm = albert_mlm_head(cfg, key=km)
        self.sop = SOPHead(cfg, key=ks)
        self.cfg = cfg

    @property
    def ponder_weight(self) -> float:
        # only adaptive halting ponders
        return setting("act.tau", self.cfg.tau) if self.cfg.adaptive else 0.0

    def halting_prob(self, h_hat_BTD: Array) -> Array:
        """p = sigmoid(w_h . h_hat + b_h), float32 [B, T]."""
        logit = jnp.einsum("btd,d->bt", h_hat_BTD, self.halt_w_D.astype(h_hat_BTD.dtype),
                           preferred_element_type=jnp.float32)
        return jax.nn.sigmoid(logit + self.halt_b)

    def _step_fn(self, mask_BT: Array, key: Array | None) -> StepFn:
        # Dropout keys are folded with the iteration index, so scan and while see the same masks.
        rate = self.dropout_rate

        def step(n, h_BTD):
            k = None if key is None else jax.random.fold_in(key, n)
            h_hat = self.layer(h_BTD, mask_BT, rate, k)
            return h_hat, self.halting_prob(h_hat)

        return step

    def _embed(self, tokens_BT, segments_BT, mask_BT, key):
        segments_BT, mask_BT = default_inputs(tokens_BT, segments_BT, mask_BT)
        k_emb, k_layer = split_or_none(key, 2)
        return self.embed(tokens_BT, segments_BT, self.dropout_rate, k_emb), mask_BT, k_layer

    def _fixed(self, h0_BTD, mask_BT, key, return_states) -> ACTOutput:
        """halting="fixed": the shared layer applied exactly M times to every position."""
        cfg = self.cfg
        step = self._step_fn(mask_BT, key)

        def body(h, n):
            h = step(n, h)[0]
            return h, (h if return_states else None)

        if cfg.remat:
            body = jax.checkpoint(body)
        h, states = jax.lax.scan(body, h0_BTD, jnp.arange(cfg.max_iters, dtype=jnp.int32))
        N = cfg.max_iters * mask_BT.astype(jnp.float32)
        return ACTOutput(h, N, jnp.zeros_like(N), states, _iterations(N))

    def _forward(self, driver, tokens_BT, segments_BT, mask_BT, key, return_states,
                 **driver_kw) -> ACTOutput:
        h0, mask_BT, k_layer = self._embed(tokens_BT, segments_BT, mask_BT, key)
        if not self.cfg.adaptive:  # every token runs M iterations
            return self._fixed(h0, mask_BT, k_layer, return_states)
        return driver(self._step_fn(mask_BT, k_layer), h0, mask_BT, self.cfg.max_iters,
                      self.cfg.eps, return_states=return_states, **driver_kw)

    def forward_scan(self, tokens_BT: Array, segments_BT: Array | None = None,
                     mask_BT: Array | None = None, *, key: Array | None = None,
                     return_states: bool = False) -> ACTOutput:
        """Training path: masked ``lax.scan`` of length M. Dropout is active iff a key is given."""
        return self._forward(halting_scan, tokens_BT, segments_BT, mask_BT, key, return_states,
                             remat=self.cfg.remat)

    def forward_while(self, tokens_BT: Array, segments_BT: Array | None = None,
                      mask_BT: Array | None = None, *, key: Array | None = None,
                      return_states: bool = False) -> ACTOutput:
        """Inference path: ``lax.while_loop`` that stops when every real token has halted."""
        return self._forward(halting_while, tokens_BT, segments_BT, mask_BT, key, return_states)

    __call__ = forward_scan


# ------------------------------------------------------------------------ untied BERT baseline

class UntiedEncoder(_Pretrainable, Encoder):
    """M separate post-LN layers: the ``Encoder`` of models/encoder.py with ALBERT's embeddings
    and layers, and the same MLM and SOP heads as ACTEncoder."""

    embed: ALBERTEmbeddings
    layers: PostLNLayer  # every leaf has a leading layer axis M
    mlm: MLMHead
    sop: SOPHead
    cfg: ACTConfig = eqx.field(static=True)
    _extra_shape_fields = ("max_iters",)  # its depth: M stacked layers

    def __init__(self, cfg: ACTConfig, *, key: Array):
        ke, kl, km, ks = jax.random.split(key, 4)
        self.embed = ALBERTEmbeddings(cfg, key=ke)
        self.layers = init_stack(lambda k: albert_layer(cfg, key=k), cfg.max_iters, key=kl)
        self.mlm = albert_mlm_head(cfg, key=km)
        self.sop = SOPHead(cfg, key=ks)
        self.cfg = cfg

    ponder_weight = 0.0
    scan_layers = True  # ACTConfig has no unrolled option

    def __call__(self, tokens_BT: Array, segments_BT: Array | None = None,
                 mask_BT: Array | None = None, *, key: Array | None = None,
                 return_states: bool = False) -> ACTOutput:
        segments_BT, mask_BT = default_inputs(tokens_BT, segments_BT, mask_BT)
        h, states = self.forward(tokens_BT, segments_BT, mask_BT, key=key,
                                 all_layers=return_states)
        N = self.cfg.max_iters * mask_BT.astype(jnp.float32)
        return ACTOutput(h, N, jnp.zeros_like(N), states, _iterations(N))

    forward_scan = forward_while = __call__


# ------------------------------------------------------------------------ fine-tuning head

class EncoderClassifier(OverEncoder):
    """An encoder with a classification head: on [CLS] for sentence tasks, on every token for
    token tasks (grammatical roles). The encoder keeps its halting, so fine-tuning pays the
    ponder cost as in pretraining (Simoulin & Crabbé)."""

    encoder: eqx.Module  # ACTEncoder or UntiedEncoder
    head: Dense  # d_model -> labels
    token_level: bool = eqx.field(static=True)

    def __init__(self, encoder, n_labels: int, token_level: bool, *, key: Array):
        self.encoder = encoder
        self.head = Dense(encoder.cfg.d_model, n_labels, key=key)
        self.token_level = token_level

    def flops_per_token(self, seq_len: int) -> int:
        return self.encoder.flops_per_token(seq_len)  # the head is left out

    def __call__(self, tokens_BT: Array, segments_BT: Array, mask_BT: Array, *,
                 key: Array | None = None, inference: bool = False):
        """(float32 logits [B, labels] or [B, T, labels], the encoder's ACTOutput).
        `inference` runs the while-loop path of an ACT encoder (cost follows the depth)."""
        k_enc, k_drop = split_or_none(key, 2)
        forward = getattr(self.encoder, "forward_while" if inference else "forward_scan")
        out = forward(tokens_BT, segments_BT, mask_BT, key=k_enc)
        h = out.h_BTD if self.token_level else out.h_BTD[:, 0]
        h = dropout(h, self.encoder.dropout_rate, k_drop)
        return self.head(h).astype(jnp.float32), out
