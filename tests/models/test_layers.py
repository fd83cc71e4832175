"""Layers against plain NumPy / pure-Python references."""
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.models import layers
from jaxdepth.models.layers import (Attention, GatedMLP, RelativePositionBias, RMSNorm, dropout,
                                    relative_position_bucket, shared_over_batch)


bucket = jax.jit(relative_position_bucket, static_argnums=(1, 2))


def t5_causal_bucket(q, k, n_buckets=32, max_distance=128):
    """T5 causal bucketing, written from the paper's description in pure Python."""
    n = max(q - k, 0)
    exact = n_buckets // 2
    if n < exact:
        return n
    return min(n_buckets - 1,
               exact + int(math.log(n / exact) / math.log(max_distance / exact) * (n_buckets - exact)))


def test_bucket_against_python_reference_all_pairs():
    q = np.arange(301)[:, None]
    k = np.arange(301)[None, :]
    got = np.asarray(bucket(jnp.asarray(k - q), 32, 128))
    ref = np.array([[t5_causal_bucket(i, j) for j in range(301)] for i in range(301)])
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.int32


def test_bucket_hand_values():
    # distance -> bucket, by hand: 16 + floor(log(n/16) / log(8) * 16), capped at 31
    hand = {0: 0, 1: 1, 15: 15, 16: 16, 17: 16, 20: 17,  # log(1.25)/log(8)*16 = 1.72
            32: 21,   # 16/3 = 5.33
            64: 26,   # 32/3 = 10.67
            127: 31,  # log(7.9375)/log(8)*16 = 15.94
            128: 31, 1000: 31, 10**6: 31}
    d = np.array(sorted(hand))
    got = np.asarray(bucket(jnp.asarray(-d), 32, 128))
    np.testing.assert_array_equal(got, [hand[x] for x in sorted(hand)])
    # future keys (key after query) land in bucket 0
    np.testing.assert_array_equal(
        np.asarray(bucket(jnp.asarray([1, 5, 300]), 32, 128)), [0, 0, 0])
    # the numpy path gives the same buckets
    np.testing.assert_array_equal(relative_position_bucket(-d, 32, 128, xp=np), got)


def test_bucket_other_sizes():
    d = np.arange(0, 200)
    got = np.asarray(bucket(jnp.asarray(-d), 16, 64))
    np.testing.assert_array_equal(got, [t5_causal_bucket(int(x), 0, 16, 64) for x in d])


# Modules are built and called under jit: on CPU every eager op is a separate compilation.
call = eqx.filter_jit(lambda module, *args: module(*args))


def test_relative_position_bias_table_lookup(getkey):
    rpb = eqx.filter_jit(lambda k: RelativePositionBias(32, 3, 128, key=k))(getkey())
    table = np.asarray(rpb.table)
    assert table.shape == (32, 3)
    q = np.arange(20)
    bias = np.asarray(call(rpb, jnp.asarray(q), jnp.asarray(q)))
    assert bias.shape == (3, 20, 20)
    ref = np.empty((3, 20, 20), np.float32)
    for i in range(20):
        for j in range(20):
            ref[:, i, j] = table[t5_causal_bucket(i, j)]
    np.testing.assert_array_equal(bias, ref)
    # batched query positions (as in decoding with per-example offsets)
    qb = jnp.asarray([[3, 4], [10, 11]])
    kb = jnp.arange(12)
    out = np.asarray(call(rpb, qb, kb))
    assert out.shape == (2, 3, 2, 12)
    for b in range(2):
        for t in range(2):
            for s in range(12):
                np.testing.assert_array_equal(out[b, :, t, s], table[t5_causal_bucket(int(qb[b, t]), s)])


def np_rmsnorm(x, scale, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def test_rmsnorm_against_numpy():
    rng = np.random.default_rng(0)
    norm = RMSNorm(24)
    np.testing.assert_array_equal(np.asarray(norm.scale), np.ones(24))
    scale = rng.standard_normal(24).astype(np.float32)
    norm = eqx.tree_at(lambda m: m.scale, norm, jnp.asarray(scale))
    x = (3.0 * rng.standard_normal((2, 5, 24)) + 0.5).astype(np.float32)
    got = np.asarray(call(norm, jnp.asarray(x)))
    np.testing.assert_allclose(got, np_rmsnorm(x, scale), rtol=1e-5, atol=1e-6)
    # no mean subtraction: a constant vector c maps to sign(c) * scale (up to eps)
    c = np.full((1, 24), -2.0, np.float32)
    np.testing.assert_allclose(np.asarray(call(norm, jnp.asarray(c)))[0], -scale, rtol=1e-5)
    # eps matters for tiny inputs: x = 1e-4 -> 1e-4 / sqrt(1e-8 + 1e-6)
    tiny = np.full((1, 24), 1e-4, np.float32)
    np.testing.assert_allclose(np.asarray(call(norm, jnp.asarray(tiny)))[0],
                               1e-4 / math.sqrt(1e-8 + 1e-6) * scale, rtol=1e-5)
    # bf16 input: computed in float32, returned in bf16
    yb = call(norm, jnp.asarray(x, jnp.bfloat16))
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(yb, np.float32),
                               np_rmsnorm(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), scale),
                               rtol=2 ** -7, atol=2 ** -7)


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def test_gated_mlp_against_numpy(getkey):
    mlp = eqx.filter_jit(lambda k: GatedMLP(16, 40, key=k))(getkey())
    assert mlp.wi_0.shape == (16, 40) and mlp.wi_1.shape == (16, 40) and mlp.wo.shape == (40, 16)
    x = np.random.default_rng(1).standard_normal((2, 7, 16)).astype(np.float32)
    w0, w1, wo = (np.asarray(a, np.float64) for a in (mlp.wi_0, mlp.wi_1, mlp.wo))
    ref = (np_gelu_tanh(x @ w0) * (x @ w1)) @ wo
    np.testing.assert_allclose(np.asarray(call(mlp, jnp.asarray(x))), ref, rtol=1e-5, atol=1e-5)
    # hand values of the activation: gelu_tanh(1) = 0.841192, gelu_tanh(-1) = -0.158808
    np.testing.assert_allclose(np_gelu_tanh(np.array([1.0, -1.0])), [0.841192, -0.158808], atol=1e-6)


def np_attention(x, wq, wk, wv, wo, bias_NTT, n_heads):
    B, T, D = x.shape
    H = D // n_heads
    q = (x @ wq).reshape(B, T, n_heads, H)
    k = (x @ wk).reshape(B, T, n_heads, H)
    v = (x @ wv).reshape(B, T, n_heads, H)
    out = np.zeros((B, T, n_heads, H))
    for b in range(B):
        for n in range(n_heads):
            for t in range(T):
                s = np.array([q[b, t, n] @ k[b, j, n] + bias_NTT[n, t, j] for j in range(t + 1)])
                p = np.exp(s - s.max())
                p /= p.sum()
                out[b, t, n] = sum(p[j] * v[b, j, n] for j in range(t + 1))
    return out.reshape(B, T, D) @ wo


def test_attention_against_numpy(getkey):
    D, N, T = 32, 4, 9
    attn = eqx.filter_jit(lambda k: Attention(D, N, key=k))(getkey())
    rng = np.random.default_rng(2)
    bias = rng.standard_normal((N, T, T)).astype(np.float32)
    x = rng.standard_normal((2, T, D)).astype(np.float32)
    ws = [np.asarray(w, np.float64) for w in (attn.wq, attn.wk, attn.wv, attn.wo)]
    ref = np_attention(x.astype(np.float64), *ws, bias.astype(np.float64), N)
    got = np.asarray(call(attn, jnp.asarray(x), jnp.asarray(bias)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # no hidden 1/sqrt(head_dim) at run time: scaling wq by c scales the scores by c
    attn2 = eqx.tree_at(lambda a: a.wq, attn, attn.wq * 2.0)
    ws2 = [ws[0] * 2.0] + ws[1:]
    ref2 = np_attention(x.astype(np.float64), *ws2, bias.astype(np.float64), N)
    np.testing.assert_allclose(np.asarray(call(attn2, jnp.asarray(x), jnp.asarray(bias))), ref2,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B", [1, 3, 8, 32])
def test_shared_over_batch_gradient_is_the_sequential_sum(B):
    """The shared bias's gradient: the B slices added in order, in float32 (NumPy, one add at a
    time), whatever the shape; vmapped over trials, each trial's is its run of one's."""
    shape = (4, 16, 16)
    rng = np.random.default_rng(B)
    x = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    scale = 10.0 ** rng.integers(-3, 4, (3, B, 1, 1, 1))
    g = (rng.standard_normal((3, B, *shape)) * scale).astype(np.float32)

    def grad(x, g):
        return jax.vjp(lambda x: shared_over_batch(x, B), x)[1](g)[0]

    out = shared_over_batch(x, B)
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(np.asarray(x), (B, *shape)))
    trials = np.asarray(jax.jit(jax.vmap(grad, in_axes=(None, 0)))(x, jnp.asarray(g)))
    for k in range(3):
        ref = g[k, 0].copy()
        for b in range(1, B):
            ref = (ref + g[k, b]).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(jax.jit(grad)(x, jnp.asarray(g[k]))), ref)
        np.testing.assert_array_equal(trials[k], ref)


def test_attention_bias_gradient_sums_the_examples(getkey):
    """The shared bias's gradient through Attention is the sum of each example's own (on one
    CPU device by adds)."""
    D, N, T, B = 32, 4, 16, 3
    if jax.default_backend() == "cpu" and jax.device_count() == 1:
        assert layers.shared_bias(jnp.zeros((N, T, T)), B).shape == (B, N, T, T)
    attn = eqx.filter_jit(lambda k: Attention(D, N, key=k))(getkey())
    rng = np.random.default_rng(3)
    bias = jnp.asarray(rng.standard_normal((N, T, T)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((B, T, D)).astype(np.float32))
    ct = jnp.asarray(rng.standard_normal((B, T, D)).astype(np.float32))
    shared = jax.jit(jax.grad(lambda b: jnp.vdot(attn(x, b), ct)))(bias)
    causal = jnp.tril(jnp.ones((T, T), bool))[None, None]
    per_example = jax.jit(jax.grad(lambda b: jnp.vdot(
        attn.attend(*attn.project_qkv(x), b, causal), ct)))(jnp.broadcast_to(bias, (B, N, T, T)))
    np.testing.assert_allclose(np.asarray(shared),
                               np.asarray(per_example, np.float64).sum(0), rtol=1e-5, atol=1e-6)


def test_dropout_function(getkey):
    x = jnp.ones((200, 100))
    assert dropout(x, 0.3, None) is x
    assert dropout(x, 0.0, getkey()) is x
    y = np.asarray(dropout(x, 0.25, getkey()))
    kept = y != 0
    # inverted dropout: kept values are 1 / (1 - rate)
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    # 20000 Bernoulli(0.75) draws: std of the kept fraction is sqrt(.75*.25/2e4) = 0.0031; 5 sigma
    assert abs(kept.mean() - 0.75) < 5 * math.sqrt(0.75 * 0.25 / kept.size)


def test_layer_norm_against_numpy(getkey):
    from jaxdepth.models.layers import LayerNorm

    x = np.asarray(jax.random.normal(getkey(), (3, 5, 16)), np.float64) * 3 + 1
    ln = LayerNorm(16, eps=1e-5)
    ln = eqx.tree_at(lambda m: (m.scale, m.bias), ln,
                     (jax.random.normal(getkey(), (16,)), jax.random.normal(getkey(), (16,))))
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    ref = ref * np.asarray(ln.scale) + np.asarray(ln.bias)
    np.testing.assert_allclose(ln(jnp.asarray(x, jnp.float32)), ref, rtol=1e-5, atol=1e-5)
