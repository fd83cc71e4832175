"""Schedules, weight-decay mask, LM loss sums and the FLOPs convention, against hand values."""
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ModelConfig, OptimConfig
from jaxdepth.models.depth_family import param_count
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.tasks.losses import lm_loss_sums, token_nll
from jaxdepth.models.flops import matmul_params, train_flops_per_token
from jaxdepth.models.declared import decay_mask
from jaxdepth.optim import make_optimizer, schedule


def lr_at(cfg, total, steps):
    f = schedule(cfg, total)
    py = np.array([float(f(s)) for s in steps])  # Python ints, as the training loop logs them
    arr = np.asarray(jax.vmap(f)(jnp.asarray(steps, jnp.int32)))  # int32, as optax's step count
    np.testing.assert_allclose(arr, py, rtol=1e-6, atol=1e-9)
    return py


# lr 0.1, 10 warmup steps, 110 steps in all: decay over 100 steps to 0.1 * 0.1 = 0.01
WARM = dict(lr=0.1, warmup_steps=10, min_lr_ratio=0.1)
STEPS = [0, 5, 10, 35, 60, 110, 500]


def test_cosine_schedule_hand_values():
    cfg = OptimConfig(schedule="cosine", **WARM)
    c = lambda s: 0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 100)))  # noqa: E731
    hand = [0.0, 0.05, 0.1, c(35), c(60), 0.01, 0.01]
    assert c(35) == pytest.approx(0.0868198, abs=1e-7)  # 0.1 * (0.1 + 0.45 * (1 + cos(pi/4)))
    assert c(60) == pytest.approx(0.055)
    np.testing.assert_allclose(lr_at(cfg, 110, STEPS), hand, rtol=1e-6, atol=1e-9)


def test_linear_schedule_hand_values():
    cfg = OptimConfig(schedule="linear", **WARM)
    hand = [0.0, 0.05, 0.1, 0.1 - 0.09 * 0.25, 0.1 - 0.09 * 0.5, 0.01, 0.01]
    np.testing.assert_allclose(lr_at(cfg, 110, STEPS), hand, rtol=1e-6, atol=1e-9)


def test_constant_schedule_hand_values():
    cfg = OptimConfig(schedule="constant", **WARM)
    hand = [0.0, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1]
    np.testing.assert_allclose(lr_at(cfg, 110, STEPS), hand, rtol=1e-6, atol=1e-9)
    no_warm = OptimConfig(schedule="constant", lr=0.1, warmup_steps=0)
    np.testing.assert_allclose(lr_at(no_warm, 110, [0, 1, 1000]), [0.1] * 3, rtol=1e-6)
    cos_no_warm = OptimConfig(schedule="cosine", lr=0.1, warmup_steps=0, min_lr_ratio=0.0)
    np.testing.assert_allclose(lr_at(cos_no_warm, 100, [0, 50, 100]), [0.1, 0.05, 0.0],
                               rtol=1e-6, atol=1e-9)


def test_rsqrt_schedule():
    cfg = OptimConfig(schedule="rsqrt", lr=1.0, warmup_steps=10000)
    steps = [0, 1, 5000, 10000, 40000, 1_000_000]
    hand = [0.01, 0.01, 0.01, 0.01, 0.005, 0.001]
    np.testing.assert_allclose(lr_at(cfg, 10, steps), hand, rtol=1e-6)
    cfg2 = OptimConfig(schedule="rsqrt", lr=0.5, warmup_steps=4)
    steps2 = [0, 3, 4, 9, 16, 100]
    np.testing.assert_allclose(lr_at(cfg2, 10, steps2),
                               [0.5 / math.sqrt(max(s, 4)) for s in steps2], rtol=1e-6)


@pytest.fixture(scope="module")
def model():
    """A DecoderLM with the real structure; random NumPy weights instead of its (slow to
    compile on CPU) initialisers, which test_decoder.py checks."""
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, d_ff=24, n_heads=2)
    shapes = eqx.filter_eval_shape(DecoderLM, cfg, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
        if isinstance(x, jax.ShapeDtypeStruct) else x, shapes)


def test_decay_mask(model):
    assert isinstance(model, DecoderLM)
    mask = decay_mask(eqx.filter(model, eqx.is_array))
    assert mask.final_norm.scale is False
    assert mask.blocks.attn_norm.scale is False
    assert mask.blocks.mlp_norm.scale is False
    for m in (mask.blocks.attn.wq, mask.blocks.attn.wk, mask.blocks.attn.wv, mask.blocks.attn.wo,
              mask.blocks.mlp.wi_0, mask.blocks.mlp.wi_1, mask.blocks.mlp.wo, mask.lm_head):
        assert m is True
    assert sum(not b for b in jax.tree.leaves(mask)) == 3


def test_adamw_decays_matrices_not_norms(model):
    """With zero gradients AdamW's update is pure decoupled decay: -lr * wd * p where masked in."""
    cfg = OptimConfig(name="adamw", lr=0.1, schedule="constant", warmup_steps=0,
                      weight_decay=0.5, clip_norm=1.0)
    opt = make_optimizer(cfg, total_steps=10)
    params = eqx.filter(model, eqx.is_array)
    state = opt.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    upd, _ = jax.jit(opt.update)(zeros, state, params)
    np.testing.assert_array_equal(np.asarray(upd.final_norm.scale), 0.0)
    np.testing.assert_array_equal(np.asarray(upd.blocks.mlp_norm.scale), 0.0)
    for u, p in ((upd.blocks.mlp.wi_0, params.blocks.mlp.wi_0), (upd.lm_head, params.lm_head),
                 (upd.blocks.attn.wq, params.blocks.attn.wq)):
        np.testing.assert_allclose(np.asarray(u), -0.1 * 0.5 * np.asarray(p), rtol=1e-6, atol=1e-9)


def np_log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_lm_loss_sums_against_numpy():
    rng = np.random.default_rng(0)
    B, T, V = 3, 5, 11
    logits = (3 * rng.standard_normal((B, T, V)) + 2).astype(np.float32)
    targets = rng.integers(0, V, (B, T))
    weights = (rng.random((B, T)) > 0.3).astype(np.float32)
    weights[0, 0] = 0.5
    x = logits.astype(np.float64)
    logp = np_log_softmax(x)
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    logz = np.log(np.exp(x).sum(-1))
    ref_nll = (nll * weights).sum()
    ref_obj = ref_nll + 1e-4 * (logz ** 2 * weights).sum()
    obj, nll_sum, wsum = lm_loss_sums(jnp.asarray(logits), jnp.asarray(targets, jnp.int32),
                                      jnp.asarray(weights), z_loss=1e-4)
    np.testing.assert_allclose(float(nll_sum), ref_nll, rtol=1e-5)
    np.testing.assert_allclose(float(obj), ref_obj, rtol=1e-5)
    assert float(obj) > float(nll_sum)
    np.testing.assert_allclose(float(wsum), weights.sum(), rtol=1e-6)
    obj0, nll0, _ = lm_loss_sums(jnp.asarray(logits), jnp.asarray(targets, jnp.int32),
                                 jnp.asarray(weights))
    np.testing.assert_allclose(float(obj0), ref_nll, rtol=1e-5)
    assert float(obj0) == float(nll0)
    # bf16 logits are upcast: same as float32 logits of the bf16 values
    lb = jnp.asarray(logits, jnp.bfloat16)
    per_tok, _ = token_nll(lb, jnp.asarray(targets, jnp.int32))
    assert per_tok.dtype == jnp.float32
    xb = np.asarray(lb, np.float64)
    ref_b = -np.take_along_axis(np_log_softmax(xb), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(per_tok), ref_b, rtol=1e-5, atol=1e-5)


def test_lm_loss_hand_value():
    # uniform logits over 4 classes: NLL = log 4 per token, log Z = log 4 + 0
    logits = jnp.zeros((1, 2, 4), jnp.float32)
    obj, nll, w = lm_loss_sums(logits, jnp.asarray([[1, 3]], jnp.int32), jnp.ones((1, 2), jnp.float32),
                               z_loss=0.1)
    assert float(nll) == pytest.approx(2 * math.log(4), rel=1e-6)
    assert float(obj) == pytest.approx(2 * math.log(4) + 0.1 * 2 * math.log(4) ** 2, rel=1e-6)
    assert float(w) == 2.0


def test_flops_convention():
    m = ModelConfig(vocab_size=512, d_model=128, n_layers=4, d_ff=512, n_heads=2)
    # N = 4 * (3*128*512 + 4*128*128) + 128*512 = 4 * 262144 + 65536
    assert matmul_params(m) == 1_114_112
    # 6 N + 12 L T D at T = 128: 6 * 1114112 + 12 * 4 * 128 * 128
    assert train_flops_per_token(m, 128) == 6_684_672 + 786_432 == 7_471_104
    assert train_flops_per_token(m, 1) == 6 * 1_114_112 + 12 * 4 * 128
    # matmul params = all params minus the input embedding, norm scales and the bias table
    assert param_count(m) == 1_180_864
    assert matmul_params(m) == param_count(m) - 512 * 128 - (2 * 4 + 1) * 128 - 32 * 2


def test_flops_match_a_counted_forward():
    """The 2N + 4LTD forward FLOPs/token agree with XLA's own count of the matmul FLOPs."""
    # unrolled layers: XLA's cost analysis counts a while-loop (scan) body only once
    m = ModelConfig(vocab_size=48, d_model=32, n_layers=2, d_ff=40, n_heads=2, scan_layers=False)
    model = eqx.filter_eval_shape(DecoderLM, m, key=jax.random.key(0))
    T = 16
    tokens = jax.ShapeDtypeStruct((1, T), jnp.int32)
    params, static = eqx.partition(model, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    lowered = jax.jit(lambda p, t: eqx.combine(p, static)(t)).lower(params, tokens)
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = cost["flops"]
    analytic = train_flops_per_token(m, T) / 3 * T
    # XLA also counts elementwise work (norms, gelu, softmax): about 6% here
    assert analytic <= flops <= 1.10 * analytic, (flops, analytic)


def _xent_reference(x, w, t, wt, z_loss):
    """float64 NumPy: objective and NLL sums of softmax(x @ w), and their gradients."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    logits = x @ w
    m = logits.max(-1, keepdims=True)
    logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    p = np.exp(logits - logz[:, None])
    onehot = np.eye(w.shape[1])[t]
    nll = np.sum((logz - logits[np.arange(len(t)), t]) * wt)
    obj = nll + z_loss * np.sum(logz**2 * wt)
    d_obj = (p - onehot) * wt[:, None] + z_loss * 2 * (logz * wt)[:, None] * p
    return obj, nll, d_obj @ w.T, x.T @ d_obj


@pytest.mark.parametrize("z_loss,chunk", [(0.0, 8), (1e-2, 8), (1e-2, 64), (0.0, 5)])
def test_fused_lm_head_loss_matches_numpy(getkey, z_loss, chunk):
    """Values and gradients of the chunked custom_vjp loss, including a ragged last chunk
    (37 tokens) and zero-weight tokens, against float64 NumPy."""
    from jaxdepth.tasks.losses import fused_lm_head_loss

    n, d, v = 37, 16, 50
    x = jax.random.normal(getkey(), (n, d))
    w = jax.random.normal(getkey(), (d, v)) * 0.3
    t = jax.random.randint(getkey(), (n,), 0, v)
    wt = (jax.random.uniform(getkey(), (n,)) > 0.3).astype(jnp.float32)
    obj, nll, gx, gw = _xent_reference(x, w, np.asarray(t), np.asarray(wt), z_loss)

    f = jax.jit(lambda x, w: fused_lm_head_loss(x, w, t, wt, z_loss, chunk))
    got_obj, got_nll = f(x, w)
    np.testing.assert_allclose([got_obj, got_nll], [obj, nll], rtol=1e-5)
    g = jax.jit(jax.grad(lambda x, w: f(x, w)[0], argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(g[0], gx, atol=1e-5)
    np.testing.assert_allclose(g[1], gw, atol=1e-5)
    # the NLL output has its own (z-loss free) gradient
    _, _, gx_nll, _ = _xent_reference(x, w, np.asarray(t), np.asarray(wt), 0.0)
    g_nll = jax.jit(jax.grad(lambda x: f(x, w)[1]))(x)
    np.testing.assert_allclose(g_nll, gx_nll, atol=1e-5)


def test_fused_lm_head_loss_keeps_bf16_dtypes(getkey):
    from jaxdepth.tasks.losses import fused_lm_head_loss

    x = jax.random.normal(getkey(), (12, 8)).astype(jnp.bfloat16)
    w = jax.random.normal(getkey(), (8, 20)).astype(jnp.bfloat16)
    t = jnp.arange(12, dtype=jnp.int32)
    gx, gw = jax.grad(lambda x, w: fused_lm_head_loss(x, w, t, jnp.ones(12), 0.0, 4)[0],
                      argnums=(0, 1))(x, w)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    ref = jax.grad(lambda x: lm_loss_sums((x.astype(jnp.float32) @ w.astype(jnp.float32))[None],
                                          t[None], jnp.ones((1, 12)))[0])(x.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(gx, np.float32), ref, atol=2e-2)
