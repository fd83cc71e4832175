"""FusedModel (models/fused.py) and the fusion backbones (models/backbone.py), end to end.

FE vs FT through the real train step (train/state.py): which arrays move, which get optimizer
moments, and that the step's gradient is the gradient of the NER objective w.r.t. the fusion
module and head alone. Gathering before fusion equals gathering after it; layer_states equals
every backbone's layer outputs recomputed layer by layer; fusion_param_count equals the arrays
actually built; EncoderMLM's head against a NumPy recomputation.
(The DWAtt / Concat equations themselves are tested in tests/test_fusion.py.)
"""
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ACTConfig, Config, MeshConfig, ModelConfig, apply_overrides
from jaxdepth.data.ner import LABELS
from jaxdepth.models.act import ACTEncoder, UntiedEncoder
from jaxdepth.models.backbone import depth_and_width, layer_states, strip_to_backbone
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.models.encoder import Encoder, EncoderConfig
from jaxdepth.models.encoder_mlm import EncoderMLM, gather_positions
from jaxdepth.models.fused import ExtraLayers, FusedModel, fusion_param_count
from jaxdepth.models.fusion import KEY_DIM, DWAtt, fusion_trainable
from jaxdepth.train.ner_job import ner_objective
from jaxdepth.train.optim import make_optimizer
from jaxdepth.train.sharding import make_mesh
from jaxdepth.train.state import make_train_step, sharded_init, state_shardings, trainable

B, T, P, D, V = 4, 16, 5, 32, 64
ENC = EncoderConfig(vocab_size=V, d_model=D, n_layers=3, n_heads=2, d_ff=64, max_positions=T,
                    dropout=0.1)
ACT_CFG = ACTConfig(vocab_size=V, embed_dim=16, d_model=D, n_heads=2, max_iters=3, max_len=T)


# ----------------------------------------------------------------------------------- helpers

def arrays(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def n_elements(tree) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array)))


def randomize(module, seed, scale=0.4):
    """Every floating leaf set to random values (so zero biases / unit LN scales are not trivial)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0.0, scale, x.shape), x.dtype)
        if eqx.is_inexact_array(x) else x, module)


def make_inputs(seed=0):
    """tokens / segments / mask [B, T] (rows padded at the end), positions / labels [B, P]."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 12, 9, 7])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    tokens = np.where(mask == 1, rng.integers(1, V, (B, T)), 0).astype(np.int32)
    segments = np.zeros((B, T), np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), P, replace=False))
                          for n in lengths]).astype(np.int32)
    labels = rng.integers(0, len(LABELS), (B, P)).astype(np.int32)
    labels[3, 3:] = -1  # unused word slots
    positions[3, 3:] = 0
    return {k: jnp.asarray(v) for k, v in dict(tokens=tokens, segments=segments, mask=mask,
                                                positions=positions, labels=labels).items()}


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("wikiann")
    sents = [[("John", "B-PER"), ("lives", "O"), ("in", "O"), ("Paris", "B-LOC")],
             [("Acme", "B-ORG"), ("Corp", "I-ORG"), ("hired", "O"), ("Ann", "B-PER")]]
    (d / "train").write_text("\n\n".join("\n".join(f"en:{w}\t{t}" for w, t in s)
                                         for s in sents) + "\n")
    return str(d)


def ner_cfg(ner_dir, method, mode):
    return apply_overrides(Config(), {
        "model": {"arch": "encoder", "d_model": D, "n_layers": 2, "d_ff": 64, "n_heads": 2,
                  "vocab_size": V},
        "data": {"seq_len": T, "batch_size": B},
        "task": {"name": "ner", "dir": ner_dir},
        "fusion": {"method": method, "mode": mode},
        "optim": {"name": "adamw", "lr": 1e-2},
        "mesh": {"data": 1},
        "run": {"steps": 3}})


def state_and_step(cfg):
    mesh = make_mesh(cfg.mesh)
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    _, sh = state_shardings(cfg, tx, mesh)
    return sharded_init(cfg, tx, mesh, sh), make_train_step(cfg, tx, mesh, sh, ner_objective())


def backbone_of(model):
    return model.backbone


def fusion_and_head(model):
    return (model.fusion, model.head)


# ----------------------------------------------------------- 1-3, 8: FE / FT through the step

@pytest.mark.parametrize("method", ["dwatt", "concat", "base+n"])
def test_fe_trains_only_fusion_and_head(ner_dir, method):
    cfg = ner_cfg(ner_dir, method, "fe")
    state, step = state_and_step(cfg)
    model0 = state.model
    assert isinstance(model0, FusedModel) and model0.mode == "fe" and model0.method == method
    batch = make_inputs()

    # The independent gradient: only fusion + head differentiated, the same dropout key as the
    # step's single micro-batch (fold_in(fold_in(key, step), 0)).
    fn, totals = ner_objective()
    key = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(state.key), 0), 0)
    params, static = eqx.partition(model0, trainable(model0))
    g = eqx.filter_grad(lambda p: fn(eqx.combine(p, static), batch, key, totals(batch))[0])(params)
    g_leaves = jax.tree.leaves(g)
    want_norm = math.sqrt(sum(float(jnp.sum(jnp.square(x.astype(jnp.float32)))) for x in g_leaves))
    assert want_norm > 0

    # Moments (Adam's mu and nu) exist for the trainable arrays only, not for the backbone.
    n_trainable = len(jax.tree.leaves(eqx.filter(model0, trainable(model0))))
    n_fusion_head = len(jax.tree.leaves(eqx.filter(fusion_and_head(model0), eqx.is_inexact_array)))
    if method == "dwatt":
        n_fusion_head -= 1  # k_pos
    assert n_trainable == n_fusion_head
    moments = [x for x in jax.tree.leaves(state.opt_state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2 * n_trainable
    assert sum(int(x.size) for x in moments) == 2 * n_elements(eqx.filter(model0, trainable(model0)))

    bb0 = arrays(backbone_of(model0))
    fh0 = arrays(fusion_and_head(model0))
    kpos0 = np.asarray(model0.fusion.k_pos.value) if method == "dwatt" else None

    state, metrics = step(state, batch)
    np.testing.assert_allclose(float(metrics["grad_norm"]), want_norm, rtol=1e-5)
    for _ in range(2):
        state, _ = step(state, batch)
    assert int(state.step) == 3

    bb1 = arrays(backbone_of(state.model))
    assert len(bb1) == len(bb0) and all(np.array_equal(a, b) for a, b in zip(bb0, bb1))
    fh1 = arrays(fusion_and_head(state.model))
    changed = [not np.array_equal(a, b) for a, b in zip(fh0, fh1)]
    n_frozen = 1 if method == "dwatt" else 0
    assert sum(changed) == len(fh0) - n_frozen  # every trainable fusion/head array moved
    if method == "dwatt":
        assert np.array_equal(np.asarray(state.model.fusion.k_pos.value), kpos0)


def test_base_n_fe_spec_and_update(ner_dir):
    """Base+n in FE: its fresh layers are trainable and move; the backbone is neither."""
    cfg = ner_cfg(ner_dir, "base+n", "fe")
    state, step = state_and_step(cfg)
    model0 = state.model
    assert isinstance(model0.fusion, ExtraLayers) and model0.fusion.n == 1
    spec = model0.trainable_spec()
    assert not any(jax.tree.leaves(spec.backbone))
    fusion_spec = jax.tree.leaves(spec.fusion)
    assert len(fusion_spec) == len(jax.tree.leaves(model0.fusion)) and all(fusion_spec)
    assert all(jax.tree.leaves(spec.head))
    extra0 = arrays(model0.fusion)
    bb0 = arrays(model0.backbone)
    state, _ = step(state, make_inputs(1))
    extra1 = arrays(state.model.fusion)
    assert all(not np.array_equal(a, b) for a, b in zip(extra0, extra1))
    assert all(np.array_equal(a, b) for a, b in zip(bb0, arrays(state.model.backbone)))


@pytest.mark.parametrize("method", ["dwatt", "base+n"])
def test_fe_computes_no_backbone_gradient(getkey, method):
    batch = make_inputs(2)
    fn, totals = ner_objective()
    grads = {}
    for mode in ("fe", "ft"):
        model = FusedModel(Encoder(ENC, key=jax.random.key(3)), method=method, mode=mode,
                           n_labels=len(LABELS), rate=0.1, key=jax.random.key(4))
        g = eqx.filter_grad(lambda m: fn(m, batch, getkey(), totals(batch))[0])(model)
        grads[mode] = g
    fe_bb = arrays(grads["fe"].backbone)
    assert len(fe_bb) == len(arrays(Encoder(ENC, key=jax.random.key(3))))
    assert all(not np.any(x) for x in fe_bb)
    ft_bb = arrays(grads["ft"].backbone)
    assert sum(bool(np.any(x)) for x in ft_bb) >= len(ft_bb) // 2
    # The fusion / head gradient exists in both modes.
    for mode in ("fe", "ft"):
        assert any(np.any(x) for x in arrays(grads[mode].head))
        assert any(np.any(x) for x in arrays(grads[mode].fusion))
    if method == "dwatt":
        for mode in ("fe", "ft"):
            assert not np.any(np.asarray(grads[mode].fusion.k_pos.value))


def test_ft_trains_the_backbone_but_not_k_pos(ner_dir):
    cfg = ner_cfg(ner_dir, "dwatt", "ft")
    state, step = state_and_step(cfg)
    model0 = state.model
    assert model0.mode == "ft"
    spec = trainable(model0)
    assert all(jax.tree.leaves(eqx.filter(spec.backbone, lambda x: x is not None)))
    n_trainable = len(jax.tree.leaves(eqx.filter(model0, spec)))
    moments = [x for x in jax.tree.leaves(state.opt_state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2 * n_trainable
    bb0 = arrays(model0.backbone)
    kpos0 = np.asarray(model0.fusion.k_pos.value)
    batch = make_inputs(3)
    for _ in range(3):
        state, _ = step(state, batch)
    bb1 = arrays(state.model.backbone)
    changed = [not np.array_equal(a, b) for a, b in zip(bb0, bb1)]
    # Every backbone array moves except the unused token-type row table... which moves too:
    # row 0 of it is used by every token. So all of them do.
    assert all(changed), f"{sum(changed)} of {len(changed)} backbone arrays changed"
    assert np.array_equal(np.asarray(state.model.fusion.k_pos.value), kpos0)


# ------------------------------------------------------------- 4: gather before / gather after

@pytest.mark.parametrize("method", ["dwatt", "concat", "base", "base+n"])
@pytest.mark.parametrize("mode", ["fe", "ft"])
def test_gather_before_equals_gather_after(method, mode):
    inp = make_inputs(4)
    model = FusedModel(Encoder(ENC, key=jax.random.key(5)), method=method, mode=mode,
                       n_labels=len(LABELS), key=jax.random.key(6))
    model = eqx.tree_at(lambda m: m.fusion, model, randomize(model.fusion, 7)) \
        if model.fusion is not None else model
    args = (inp["tokens"], inp["segments"], inp["mask"])
    full = eqx.filter_jit(lambda m: m.features(*args))(model)
    at = eqx.filter_jit(lambda m: m.features(*args, inp["positions"]))(model)
    assert full.shape == (B, T, D) and at.shape == (B, P, D)
    want = np.take_along_axis(np.asarray(full), np.asarray(inp["positions"])[..., None], axis=1)
    np.testing.assert_allclose(np.asarray(at), want, rtol=1e-6, atol=1e-6)
    # and the NER logits too
    logits = eqx.filter_jit(lambda m: m(*args, inp["positions"]))(model)
    np.testing.assert_allclose(np.asarray(logits),
                               np.asarray(full) @ np.asarray(model.head.w) + np.asarray(model.head.b),
                               rtol=1e-5, atol=1e-5) if False else None
    want_logits = want @ np.asarray(model.head.w) + np.asarray(model.head.b)
    np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- 5: layer_states per backbone

def encoder_states_by_hand(enc: Encoder, tokens, segments, mask):
    h = enc.embed(tokens, segments)
    out = []
    for i in range(enc.cfg.n_layers):
        layer = jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, enc.layers)
        h = layer(h, mask.astype(bool))
        out.append(h)
    return jnp.stack(out)


def test_layer_states_encoder():
    inp = make_inputs(5)
    enc = randomize(Encoder(ENC, key=jax.random.key(8)), 9, scale=0.2)
    args = (inp["tokens"], inp["segments"], inp["mask"])
    z = layer_states(enc, *args)
    assert z.shape == (ENC.n_layers, B, T, D)
    np.testing.assert_allclose(np.asarray(z), np.asarray(encoder_states_by_hand(enc, *args)),
                               rtol=1e-5, atol=1e-5)
    # the unrolled (scan_layers=False) path agrees as well
    z2 = layer_states(enc.with_options(scan_layers=False), *args)
    np.testing.assert_allclose(np.asarray(z2), np.asarray(z), rtol=1e-5, atol=1e-5)
    assert depth_and_width(enc) == (ENC.n_layers, D)
    fused = FusedModel(enc, method="base", mode="fe", n_labels=3, key=jax.random.key(1))
    np.testing.assert_allclose(np.asarray(fused.features(*args)), np.asarray(z[-1]),
                               rtol=1e-6, atol=1e-6)
    # strip_to_backbone finds the encoder inside both an EncoderMLM and a FusedModel
    assert strip_to_backbone(fused) is enc
    assert strip_to_backbone(EncoderMLM(enc, key=jax.random.key(2))) is enc


@pytest.mark.parametrize("halting", ["act", "fixed"])
def test_layer_states_act(halting):
    inp = make_inputs(6)
    args = (inp["tokens"], inp["segments"], inp["mask"])
    cfg = ACT_CFG.__class__(**{**ACT_CFG.__dict__, "halting": halting})
    model = ACTEncoder(cfg, key=jax.random.key(10))
    z = layer_states(model, *args)
    assert z.shape == (cfg.max_iters, B, T, D)
    if halting == "fixed":  # ALBERT: the shared layer applied M times
        h = model.embed(inp["tokens"], inp["segments"])
        want = []
        for _ in range(cfg.max_iters):
            h = model.layer(h, inp["mask"].astype(bool))
            want.append(h)
        want = jnp.stack(want)
        last = h
    else:  # the inference driver (while_loop, filled past the last iteration) is independent
        out = model.forward_while(*args, return_states=True)
        assert 1 <= int(out.iterations_run) <= cfg.max_iters
        want, last = out.states_MBTD, out.h_BTD
    np.testing.assert_allclose(np.asarray(z), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert depth_and_width(model) == (cfg.max_iters, D)
    fused = FusedModel(model, method="base", mode="fe", n_labels=3, key=jax.random.key(1))
    np.testing.assert_allclose(np.asarray(fused.features(*args)), np.asarray(last),
                               rtol=1e-5, atol=1e-5)


def test_layer_states_untied():
    inp = make_inputs(7)
    args = (inp["tokens"], inp["segments"], inp["mask"])
    model = UntiedEncoder(ACT_CFG, key=jax.random.key(11))
    z = layer_states(model, *args)
    h = model.embed(inp["tokens"], inp["segments"])
    want = []
    for i in range(ACT_CFG.max_iters):
        layer = jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, model.layers)
        h = layer(h, inp["mask"].astype(bool))
        want.append(h)
    np.testing.assert_allclose(np.asarray(z), np.asarray(jnp.stack(want)), rtol=1e-5, atol=1e-5)
    fused = FusedModel(model, method="base", mode="ft", n_labels=3, key=jax.random.key(1))
    np.testing.assert_allclose(np.asarray(fused.features(*args)), np.asarray(h),
                               rtol=1e-5, atol=1e-5)


def test_layer_states_decoder():
    inp = make_inputs(8)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=3, d_ff=64, n_heads=2)
    model = DecoderLM(cfg, key=jax.random.key(12))
    z = layer_states(model, inp["tokens"], None, None)
    assert z.shape == (cfg.n_layers, B, T, D)
    x = model.embed[inp["tokens"]]
    pos = jnp.arange(T)
    bias = model.rel_bias(pos, pos)
    want = []
    for i in range(cfg.n_layers):
        x = model._layer(i)(x, bias, 0.0, None)
        want.append(x)
    np.testing.assert_allclose(np.asarray(z), np.asarray(jnp.stack(want)), rtol=1e-5, atol=1e-5)
    # hidden() is the final norm of the last state
    np.testing.assert_allclose(np.asarray(model.hidden(inp["tokens"])[0]),
                               np.asarray(model.final_norm(z[-1])), rtol=1e-5, atol=1e-5)
    fused = FusedModel(model, method="base", mode="fe", n_labels=3, key=jax.random.key(1))
    np.testing.assert_allclose(np.asarray(fused.features(inp["tokens"], None, None)),
                               np.asarray(x), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- 6: fusion parameter count

def base_n_by_formula(n, d, d_ff):
    attn = 4 * (d * d + d)
    return n * (attn + 2 * 2 * d + (d * d_ff + d_ff) + (d_ff * d + d))


@pytest.mark.parametrize("backbone_kind", ["encoder", "act"])
@pytest.mark.parametrize("method", ["base", "base+n", "concat", "dwatt"])
def test_fusion_param_count_matches_the_built_module(backbone_kind, method):
    if backbone_kind == "encoder":
        bb = Encoder(ENC, key=jax.random.key(13))
        L, d_ff = ENC.n_layers, ENC.d_ff
    else:
        bb = ACTEncoder(ACT_CFG, key=jax.random.key(13))
        L, d_ff = ACT_CFG.max_iters, 4 * D
    n_extra = 2
    model = FusedModel(bb, method=method, mode="fe", n_labels=5, n_extra=n_extra,
                       key=jax.random.key(14))
    count = fusion_param_count(method, bb, n_extra)
    if method == "base":
        assert model.fusion is None and count == 0
        return
    built_trainable = n_elements(eqx.filter(model.fusion, fusion_trainable(model.fusion)))
    assert count == built_trainable
    if method == "dwatt":
        assert isinstance(model.fusion, DWAtt)
        assert n_elements(model.fusion) == count + L * KEY_DIM  # k_pos is not counted
        # from the equations: L value maps (bottleneck + LN_n), f_Q, W_K
        m = D // 2
        bott = D * m + m + 2 * m + m * D + D
        assert count == L * (bott + 2 * D) + bott + KEY_DIM * D + D
    elif method == "concat":
        assert count == L * D * D + D
    else:
        assert count == base_n_by_formula(n_extra, D, d_ff)
    # and the trainable spec of the model holds exactly these plus the head (FE)
    n_head = D * 5 + 5
    assert n_elements(eqx.filter(model, model.trainable_spec())) == count + n_head


# ---------------------------------------------------------------------- 7: EncoderMLM's head

def test_encoder_mlm_masked_logits_match_numpy():
    inp = make_inputs(9)
    enc = Encoder(ENC, key=jax.random.key(15))
    model = EncoderMLM(enc, key=jax.random.key(16))
    model = eqx.tree_at(lambda m: m.head, model, randomize(model.head, 17))
    args = (inp["tokens"], inp["segments"], inp["mask"])
    logits = eqx.filter_jit(lambda m: m.masked_logits(*args, inp["positions"]))(model)
    assert logits.shape == (B, P, V) and logits.dtype == jnp.float32

    h = np.asarray(enc(inp["tokens"], inp["mask"], inp["segments"])[0], np.float64)
    pos = np.asarray(inp["positions"])
    x = h[np.arange(B)[:, None], pos]  # [B, P, D]
    hd = model.head
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    u = x @ f(hd.dense.w) + f(hd.dense.b)
    u = 0.5 * u * (1.0 + np.vectorize(math.erf)(u / math.sqrt(2.0)))
    mean = u.mean(-1, keepdims=True)
    var = ((u - mean) ** 2).mean(-1, keepdims=True)
    u = (u - mean) / np.sqrt(var + ENC.layer_norm_eps) * f(hd.norm.scale) + f(hd.norm.bias)
    want = u @ f(enc.word_VD).T + f(hd.bias_V)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)
    # gather_positions is the same gather
    np.testing.assert_array_equal(np.asarray(gather_positions(jnp.asarray(h, jnp.float32),
                                                              inp["positions"])),
                                  x.astype(np.float32))
    # The fusion model's MLM head (Base, FE) on the same encoder and head gives the same logits.
    fused = FusedModel(enc, method="base", mode="fe", mlm=True, key=jax.random.key(18))
    fused = eqx.tree_at(lambda m: m.head, fused, hd)
    np.testing.assert_allclose(np.asarray(fused.masked_logits(*args, inp["positions"])), want,
                               rtol=1e-5, atol=1e-5)
