"""ACT encoder: the halting recurrence and the whole model against NumPy references written here,
while_loop == scan, gradients (none through N), the saturated-halting limits, tied MLM head,
untied baseline, loss parts and config validation."""
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ConfigError
from jaxdepth.models.act import (PRESETS, ACTConfig, ACTEncoder, UntiedEncoder, halting_scan,
                                 halting_step, halting_while, init_halt_state)
from jaxdepth.tasks.encoder_pretrain import encoder_objective

CFG = ACTConfig(vocab_size=50, embed_dim=16, d_model=32, n_heads=2, d_ff=48, max_len=16,
                max_iters=6, tau=1e-2)
B, T = 3, 8
LENGTHS = np.array([8, 5, 2])
EPS = CFG.eps


# ------------------------------------------------------------------------ NumPy references

def f64(a):
    return np.asarray(a, np.float64)


def np_ln(x, norm):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-12) * f64(norm.scale) + f64(norm.bias)


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_dense(x, d):
    return x @ f64(d.w) + f64(d.b)


def np_layer(layer, x, mask):
    """Post-LN BERT layer, heads written out one at a time."""
    a = layer.attn
    q, k, v = np_dense(x, a.q), np_dense(x, a.k), np_dense(x, a.v)
    n_h = a.n_heads
    hd = x.shape[-1] // n_h
    heads = []
    for h in range(n_h):
        sl = slice(h * hd, (h + 1) * hd)
        s = np.einsum("btd,bsd->bts", q[..., sl], k[..., sl]) / np.sqrt(hd)
        s = np.where(mask[:, None, :], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        heads.append(np.einsum("bts,bsd->btd", s / s.sum(-1, keepdims=True), v[..., sl]))
    h1 = np_ln(x + np_dense(np.concatenate(heads, -1), a.o), layer.attn_norm)
    f = np_dense(np_gelu(np_dense(h1, layer.ff_in)), layer.ff_out)
    return np_ln(h1 + f, layer.ff_norm)


def np_embed(model, tokens, segments):
    e = model.embed
    x = f64(e.token_VE)[tokens] + f64(e.position_LE)[: tokens.shape[1]][None] + f64(e.segment_SE)[segments]
    return np_dense(np_ln(x, e.norm), e.proj)


def np_act(h0, mask, step, M, eps):
    """Per-token ACT written with branches rather than masks. step(n, h) -> (h_hat, p)."""
    h = h0.copy()
    c = np.where(mask, 0.0, 1.0).astype(h0.dtype)
    R = np.zeros_like(c)
    N = np.zeros_like(c)
    states, margin = [], np.inf
    for n in range(M):
        h_hat, p = step(n, h)
        new_h = h.copy()
        for b, t in np.ndindex(*c.shape):
            if c[b, t] >= 1:  # halted or padding: frozen
                continue
            margin = min(margin, abs(float(c[b, t] + p[b, t]) - (1 - eps)))
            N[b, t] += 1
            if c[b, t] + p[b, t] > h0.dtype.type(1 - eps):
                R[b, t] = 1 - c[b, t]
                c[b, t] = 1
                lam = R[b, t]
            else:
                c[b, t] += p[b, t]
                lam = p[b, t]
            new_h[b, t] = lam * h_hat[b, t] + (1 - lam) * h[b, t]
        h = new_h
        states.append(h)
    return h, N, R, np.stack(states), margin


def np_model_step(model, mask):
    def step(n, h):
        hh = np_layer(model.layer, h, mask)
        p = 1 / (1 + np.exp(-(hh @ f64(model.halt_w_D) + float(model.halt_b))))
        return hh, p
    return step


# ---------------------------------------------------------------------------------- fixtures

def randomize(model, seed):
    """Perturb every float leaf (norm scales, biases are 1 and 0 at init) so references see them."""
    rng = np.random.default_rng(seed)
    leaves, tree = jax.tree.flatten(model)
    new = [jnp.asarray(np.asarray(x) + 0.1 * rng.standard_normal(x.shape), jnp.float32)
           if eqx.is_inexact_array(x) else x for x in leaves]
    return jax.tree.unflatten(tree, new)


def set_halting(model, w_scale, bias, seed=0):
    w = np.random.default_rng(seed).standard_normal(model.halt_w_D.shape) * w_scale
    return eqx.tree_at(lambda m: (m.halt_w_D, m.halt_b), model,
                       (jnp.asarray(w, jnp.float32), jnp.asarray(bias, jnp.float32)))


@pytest.fixture(scope="module")
def model():
    return randomize(ACTEncoder(CFG, key=jax.random.key(0)), 1)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    segments = (np.arange(T)[None] >= rng.integers(2, 6, (B, 1))).astype(np.int32)
    mask = np.arange(T)[None] < LENGTHS[:, None]
    return tokens, segments, mask


@eqx.filter_jit
def run_scan(m, tok, seg, mask, key=None):
    return m.forward_scan(tok, seg, mask, key=key, return_states=True)


@eqx.filter_jit
def run_while(m, tok, seg, mask, key=None):
    return m.forward_while(tok, seg, mask, key=key, return_states=True)


# ------------------------------------------------------------------------ the recurrence alone

def injected(h_hat_MBTD, p_MBT):
    return lambda n, h: (h_hat_MBTD[n], p_MBT[n])


def check_against_np(h0, mask, h_hat, p, M):
    ref_h, ref_N, ref_R, ref_states, _ = np_act(h0, mask, lambda n, h: (h_hat[n], p[n]), M, EPS)
    args = (injected(jnp.asarray(h_hat), jnp.asarray(p)), jnp.asarray(h0), jnp.asarray(mask), M, EPS)
    for out in (jax.jit(lambda: halting_scan(*args, return_states=True))(),
                jax.jit(lambda: halting_while(*args, return_states=True))()):
        np.testing.assert_allclose(out.h_BTD, ref_h, atol=1e-5)
        np.testing.assert_allclose(out.states_MBTD, ref_states, atol=1e-5)
        np.testing.assert_array_equal(out.N_BT, ref_N)
        np.testing.assert_allclose(out.R_BT, ref_R, atol=1e-5)
    return ref_N, ref_R


def test_recurrence_handcrafted_tokens():
    M, D = 4, 3
    # per token: p at each iteration; comment = expected (N, R)
    p_TM = np.array([
        [0.995, 0.5, 0.5, 0.5],  # halts at once: N 1, R 1
        [0.3, 0.3, 0.5, 0.5],  # halts at 3: R 0.4
        [0.1, 0.1, 0.1, 0.1],  # never halts: N 4, R 0 (no forced remainder at the cap)
        [0.2, 0.2, 0.2, 0.9],  # halts at the cap itself: N 4, R 0.4
        [0.5, 0.49, 0.3, 0.3],  # c = 0.99 is still running (<=): halts at 3, R 0.01
        [0.9, 0.9, 0.9, 0.9],  # padding: frozen, N 0, R 0
    ], np.float32)
    p = np.ascontiguousarray(p_TM.T[:, None, :])  # [M, 1, T]
    mask = np.array([[1, 1, 1, 1, 1, 0]], bool)
    rng = np.random.default_rng(0)
    h0 = rng.standard_normal((1, 6, D)).astype(np.float32)
    h_hat = rng.standard_normal((M, 1, 6, D)).astype(np.float32)
    N, R = check_against_np(h0, mask, h_hat, p, M)
    np.testing.assert_array_equal(N[0], [1, 3, 4, 4, 3, 0])
    np.testing.assert_allclose(R[0], [1, 0.4, 0, 0.4, 0.01, 0], atol=1e-6)


def test_recurrence_random_mix():
    M, Bb, Tt, D = 7, 4, 9, 5
    rng = np.random.default_rng(1)
    # Each token gets its own typical p, so some halt at once, some late, some never
    base = rng.choice([0.02, 0.1, 0.3, 0.45, 0.7, 0.995], size=(Bb, Tt))
    p = (base * rng.uniform(0.997, 1.0, (M, Bb, Tt))).astype(np.float32)
    mask = rng.random((Bb, Tt)) < 0.8
    h0 = rng.standard_normal((Bb, Tt, D)).astype(np.float32)
    h_hat = rng.standard_normal((M, Bb, Tt, D)).astype(np.float32)
    N, _ = check_against_np(h0, mask, h_hat, p, M)
    assert {0, 1, M}.issubset(set(N.ravel().astype(int)))  # padding, immediate and capped tokens
    assert 1 < np.median(N[mask]) < M


def test_step_makes_c_exactly_one_and_freezes():
    c0 = jnp.asarray([[0.0, 0.3, 0.6123, 0.9]], jnp.float32)
    state = init_halt_state(jnp.zeros((1, 4, 2), jnp.float32), jnp.ones((1, 4), bool))
    state = state._replace(c_BT=c0)
    p = jnp.full((1, 4), 0.999, jnp.float32)
    state, lam = halting_step(state, jnp.ones((1, 4, 2), jnp.float32), p, EPS)
    np.testing.assert_array_equal(state.c_BT, 1.0)  # exactly, so "c < 1" means running
    np.testing.assert_allclose(lam, 1 - c0, atol=1e-7)
    state2, lam2 = halting_step(state, 5 * jnp.ones((1, 4, 2), jnp.float32), p, EPS)
    np.testing.assert_array_equal(lam2, 0.0)
    np.testing.assert_array_equal(state2.h_BTD, state.h_BTD)
    np.testing.assert_array_equal(state2.N_BT, state.N_BT)


# ---------------------------------------------------------------------------- the whole model

def test_model_matches_numpy_forward(model, inputs):
    tokens, segments, mask = inputs
    m = set_halting(model, 0.3, -1.0)
    h0 = np_embed(m, tokens, segments)
    ref_h, ref_N, ref_R, ref_states, margin = np_act(h0, mask, np_model_step(m, mask),
                                                     CFG.max_iters, EPS)
    assert margin > 1e-4, "a halting decision sits on the threshold; pick another seed"
    assert len(set(ref_N[mask].astype(int))) >= 3  # a real mix of depths
    out = run_scan(m, tokens, segments, mask)
    np.testing.assert_allclose(out.h_BTD, ref_h, atol=1e-5)
    np.testing.assert_allclose(out.states_MBTD, ref_states, atol=1e-5)
    np.testing.assert_array_equal(out.N_BT, ref_N)
    np.testing.assert_allclose(out.R_BT, ref_R, atol=1e-5)
    assert int(out.iterations_run) == ref_N.max()


@pytest.mark.parametrize("bias, expect_iters", [(-2.0, CFG.max_iters), (0.0, None), (3.0, 2)])
def test_while_equals_scan(model, inputs, bias, expect_iters):
    tokens, segments, mask = inputs
    m = set_halting(model, 0.3, bias)
    s = run_scan(m, tokens, segments, mask)
    w = run_while(m, tokens, segments, mask)
    np.testing.assert_allclose(w.h_BTD, s.h_BTD, atol=1e-5)
    np.testing.assert_allclose(w.states_MBTD, s.states_MBTD, atol=1e-5)
    np.testing.assert_array_equal(w.N_BT, s.N_BT)
    np.testing.assert_allclose(w.R_BT, s.R_BT, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(s.N_BT)[~mask], 0)
    assert int(w.iterations_run) == int(np.max(np.asarray(s.N_BT)[mask]))
    if expect_iters is not None:
        assert int(w.iterations_run) == expect_iters  # 2 < M: the loop really stopped early


def test_dropout_same_masks_on_both_paths(inputs):
    tokens, segments, mask = inputs
    m = randomize(ACTEncoder(dataclasses.replace(CFG, dropout=0.2), key=jax.random.key(5)), 3)
    key = jax.random.key(9)
    s, w = run_scan(m, tokens, segments, mask, key), run_while(m, tokens, segments, mask, key)
    np.testing.assert_allclose(w.h_BTD, s.h_BTD, atol=1e-5)
    np.testing.assert_array_equal(w.N_BT, s.N_BT)
    other = run_scan(m, tokens, segments, mask, jax.random.key(10))
    assert not np.allclose(s.h_BTD, other.h_BTD, atol=1e-3)


def make_batch(inputs, rng_seed=4):
    tokens, segments, mask = inputs
    rng = np.random.default_rng(rng_seed)
    P = 3
    return dict(tokens=jnp.asarray(tokens), segments=jnp.asarray(segments), mask=jnp.asarray(mask),
                mlm_positions=jnp.asarray(rng.integers(0, 2, (B, P)), jnp.int32),
                mlm_ids=jnp.asarray(rng.integers(0, CFG.vocab_size, (B, P)), jnp.int32),
                mlm_weights=jnp.asarray([[1, 1, 1], [1, 1, 0], [1, 0, 0]], jnp.float32),
                sop_labels=jnp.asarray([0, 1, 1], jnp.int32))


def loss(m, batch):
    """(total, its parts) of the pretraining objective (tasks/encoder_pretrain.py) on one batch."""
    objective, totals = encoder_objective()
    return objective(m, batch, None, totals(batch))


def test_gradients_finite_and_none_through_N(model, inputs):
    m = set_halting(model, 0.3, -1.0)
    batch = make_batch(inputs)
    grads = eqx.filter_jit(eqx.filter_grad(lambda m: loss(m, batch)[0]))(m)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(eqx.filter(grads, eqx.is_array)))
    assert float(jnp.abs(grads.halt_w_D).sum()) > 0

    @eqx.filter_jit
    def grads_of_sums(m):  # d sum(N), d sum(R) from one forward pass
        def fwd(m):
            out = m.forward_scan(batch["tokens"], batch["segments"], batch["mask"])
            return out.N_BT, out.R_BT
        (N, _), vjp = eqx.filter_vjp(fwd, m)
        one, zero = jnp.ones_like(N), jnp.zeros_like(N)
        return vjp((one, zero)), vjp((zero, one))

    (g_N,), (g_R,) = grads_of_sums(m)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(eqx.filter(g_N, eqx.is_array)))
    assert float(jnp.abs(g_R.halt_w_D).sum()) > 0  # the ponder gradient flows through R


def test_saturated_halting_limits(model, inputs):
    """b_h = -30: every real token runs all M iterations with R = 0. Per the §3 update,
    lam = p ~ 1e-13, so h[M] stays (to float precision) at the embedding output; the fixed-depth
    encoder is halting="fixed" (shared layer applied M times), checked against NumPy here."""
    tokens, segments, mask = inputs
    M = CFG.max_iters
    m = set_halting(model, 0.3, -30.0)
    h0 = np_embed(m, tokens, segments)
    for out in (run_scan(m, tokens, segments, mask), run_while(m, tokens, segments, mask)):
        np.testing.assert_array_equal(out.N_BT, M * mask)
        np.testing.assert_array_equal(out.R_BT, 0.0)
        assert int(out.iterations_run) == M
        np.testing.assert_allclose(out.h_BTD, h0, atol=1e-5)

    fixed = m.with_options(halting="fixed")
    ref = h0
    for _ in range(M):
        ref = np_layer(m.layer, ref, mask)
    for out in (run_scan(fixed, tokens, segments, mask), run_while(fixed, tokens, segments, mask)):
        np.testing.assert_allclose(out.h_BTD, ref, atol=1e-5)
        np.testing.assert_array_equal(out.N_BT, M * mask)
    assert fixed.ponder_weight == 0.0


# -------------------------------------------------------------------------------------- heads

def np_mlm_logits(m, h, positions):
    hp = np.take_along_axis(h, positions[..., None], axis=1)
    x = np_ln(np_gelu(np_dense(hp, m.mlm.dense)), m.mlm.norm)
    return x @ f64(m.embed.token_VE).T + f64(m.mlm.bias_V)


def test_mlm_head_is_tied(model, inputs):
    tokens, segments, mask = inputs
    h = run_scan(model, tokens, segments, mask).h_BTD
    pos = jnp.asarray([[0, 3], [1, 4], [0, 1]], jnp.int32)
    logits = jax.jit(lambda m: m.mlm_logits(h, pos))
    np.testing.assert_allclose(logits(model), np_mlm_logits(model, f64(h), np.asarray(pos)), atol=1e-4)
    bumped = eqx.tree_at(lambda m: m.embed.token_VE, model, model.embed.token_VE.at[7].add(1.0))
    diff = np.abs(np.asarray(logits(bumped)) - np.asarray(logits(model)))
    assert diff[..., 7].min() > 1e-3 and np.delete(diff, 7, axis=-1).max() == 0.0
    np.testing.assert_allclose(logits(bumped), np_mlm_logits(bumped, f64(h), np.asarray(pos)), atol=1e-4)
    V = CFG.vocab_size
    vocab_leaves = [x.shape for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)) if V in x.shape]
    assert sorted(vocab_leaves) == [(V,), (V, CFG.embed_dim)]  # token embedding + output bias only


def test_loss_parts(model, inputs):
    m = set_halting(model, 0.3, -1.0)
    batch = make_batch(inputs)
    total, parts = eqx.filter_jit(loss)(m, batch)
    out = run_scan(m, batch["tokens"], batch["segments"], batch["mask"])
    h = f64(out.h_BTD)
    lg = np_mlm_logits(m, h, np.asarray(batch["mlm_positions"]))
    ids, w = np.asarray(batch["mlm_ids"]), np.asarray(batch["mlm_weights"])
    ce = np.log(np.exp(lg).sum(-1)) - np.take_along_axis(lg, ids[..., None], -1)[..., 0]
    mlm = (ce * w).sum() / w.sum()
    sop_lg = np_dense(np.tanh(np_dense(h[:, 0], m.sop.pooler)), m.sop.classifier)
    lab = np.asarray(batch["sop_labels"])
    sop = np.mean(np.log(np.exp(sop_lg).sum(-1)) - sop_lg[np.arange(B), lab])
    mask = np.asarray(batch["mask"])
    ponder = np.mean(np.sum(mask * (f64(out.N_BT) + f64(out.R_BT)), -1))
    np.testing.assert_allclose([parts["mlm"], parts["sop"], parts["ponder"]], [mlm, sop, ponder],
                               rtol=1e-5)
    np.testing.assert_allclose(total, mlm + sop + CFG.tau * ponder, rtol=1e-5)


# ------------------------------------------------------------------------------ untied baseline

def test_untied_encoder_matches_numpy(inputs):
    tokens, segments, mask = inputs
    u = randomize(UntiedEncoder(CFG, key=jax.random.key(3)), 6)
    batch = make_batch(inputs)
    out, (total, parts) = eqx.filter_jit(
        lambda u: (u(tokens, segments, mask, return_states=True), loss(u, batch)))(u)
    ref = np_embed(u, tokens, segments)
    for i in range(CFG.max_iters):
        layer_i = jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, u.layers)
        ref = np_layer(layer_i, ref, mask)
        np.testing.assert_allclose(out.states_MBTD[i], ref, atol=1e-5)
    np.testing.assert_allclose(out.h_BTD, ref, atol=1e-5)
    np.testing.assert_allclose(total, parts["mlm"] + parts["sop"], rtol=1e-6)  # no ponder term
    n_tied = sum(x.size for x in jax.tree.leaves(eqx.filter(ACTEncoder(CFG, key=jax.random.key(0)),
                                                            eqx.is_array)))
    n_untied = sum(x.size for x in jax.tree.leaves(eqx.filter(u, eqx.is_array)))
    layer_size = sum(x.size for x in jax.tree.leaves(eqx.filter(u.layers, eqx.is_array))) // CFG.max_iters
    assert n_untied - n_tied == (CFG.max_iters - 1) * layer_size - CFG.d_model - 1  # minus halting unit


# --------------------------------------------------------------------------- config and options

@pytest.mark.parametrize("bad, field", [
    (dict(d_model=0), "act.d_model"), (dict(d_model=30, n_heads=4), "act.n_heads"),
    (dict(eps=1.0), "act.eps"), (dict(tau=-1.0), "act.tau"), (dict(halting="sometimes"), "act.halting"),
    (dict(dropout=1.0), "act.dropout"), (dict(max_iters=0), "act.max_iters"), (dict(d_ff=-1), "act.d_ff"),
])
def test_config_errors_name_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        ACTConfig(**bad)


def test_presets_and_options(model):
    assert {k: (v["tau"], v["max_iters"]) for k, v in PRESETS.items()} == {
        "tiny": (1e-3, 6), "small": (5e-4, 12), "base": (2.5e-4, 24)}
    assert ACTConfig.preset("small", vocab_size=99).ff == 4 * 256
    with pytest.raises(ConfigError, match="act.preset"):
        ACTConfig.preset("huge")
    assert model.with_options(max_iters=3, dropout=0.1).layer is model.layer
    with pytest.raises(ValueError, match="d_model"):
        model.with_options(d_model=64)
    with pytest.raises(ValueError, match="max_len"):
        model.embed(jnp.zeros((1, CFG.max_len + 1), jnp.int32), jnp.zeros((1, CFG.max_len + 1), jnp.int32))


def test_act_cpu_preset_starts_every_token_at_the_cap():
    """The act-cpu recipe's starting point: with b_h = -2 a fresh model runs every real token
    all M iterations (the ponder cost then pulls them down unevenly), where the act-tiny
    preset's b_h = 0 halts every token within 3. Checked on the presets' own fresh models."""
    from jaxdepth.config.presets import from_preset

    rng = np.random.default_rng(0)
    N = {}
    for name in ("act-cpu", "act-tiny"):
        cfg = from_preset(name)
        m = ACTEncoder(cfg.act, key=jax.random.key(0))
        tokens = rng.integers(6, cfg.act.vocab_size, (4, 32)).astype(np.int32)
        mask = np.ones((4, 32), bool)
        N[name] = np.asarray(run_while(m, tokens, np.zeros_like(tokens), mask).N_BT)
    assert (N["act-cpu"] == 6).all()
    assert N["act-tiny"].max() <= 3  # p near 0.5: two or three updates pass 1 - eps
    cpu = from_preset("act-cpu")
    assert (cpu.act.tau, cpu.act.max_iters, cpu.run.steps, cpu.optim.name) == (1e-4, 6, 1500, "lamb")
