"""FusedModel (models/fused.py) and the fusion backbones (models/backbone.py), end to end.

FE vs FT through the real train step (trainer/state.py): which arrays move, which get optimizer
moments, and that the step's gradient is the gradient of the NER objective w.r.t. the fusion
module and head alone. Gathering before fusion equals gathering after it; layer_states equals
every backbone's layer outputs recomputed layer by layer; FusionMethod.param_count equals the arrays
actually built; EncoderMLM's head against a NumPy recomputation.
(The DWAtt / Concat equations themselves are tested in tests/models/test_fusion.py.)
"""
import copy
import dataclasses
import logging
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ACTConfig, Config, ModelConfig, apply_overrides
from jaxdepth.data.finetune.ner_sentences import LABELS
from jaxdepth.models.act import ACTEncoder, UntiedEncoder
from jaxdepth.models.backbone import depth_and_width, strip_to_backbone
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.models.specs import EncoderConfig
from jaxdepth.models.encoder import Encoder, EncoderMLM
from jaxdepth.models.fused import FusedModel
from jaxdepth.models.fusions import fusion_method, fusion_trainable
from jaxdepth.models.fusions.base import Base
from jaxdepth.models.fusions.base_n import BasePlusN
from jaxdepth.models.fusions.dwatt import KEY_DIM, DWAtt
from jaxdepth.models.layers import gather_positions
from jaxdepth.tasks import task_for
from jaxdepth.tasks.ner import ner_objective
from jaxdepth.optim import make_optimizer
from jaxdepth.trainer.sharding import make_mesh
from jaxdepth.trainer.state import init_one, start, state_shardings

B, T, P, D, V = 4, 16, 5, 32, 64
# The shape of ner_cfg's backbone, so eager initialisation ops compiled once serve every test.
ENC = EncoderConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=2, d_ff=64, max_positions=T,
                    dropout=0.1)
ACT_CFG = ACTConfig(vocab_size=V, embed_dim=16, d_model=D, n_heads=2, d_ff=64, max_iters=3,
                    max_len=T)


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
        # the step on token batches, as FT and uncached FE take them (tests/tasks/test_state_cache.py
        # checks that the cached FE step trains the same)
        "fusion": {"method": method, "mode": mode, "cache": False},
        "optim": {"name": "adamw", "lr": 1e-2},
        "mesh": {"data": 1},
        "run": {"steps": 3}})


def state_and_step(cfg):
    """The library's initial state (trainer/state.py: one trial on its trial axis) and its
    train step, taking and giving a batch and metrics of that one trial."""
    state, step, _ = start([cfg], [task_for(cfg)], make_mesh(cfg.mesh))

    def one(state, batch):
        state, m = step(state, {k: v[None] for k, v in batch.items()})
        return state, {k: v[0] for k, v in m.items()}
    return state, one


def model_of(state):
    return state.models().one(0)


def backbone_of(model):
    return model.backbone


def fusion_and_head(model):
    return (model.fusion, model.head)


# ----------------------------------------------------------- 1-3, 8: FE / FT through the step

@pytest.mark.parametrize("method", ["dwatt", "concat", "base+n"])
def test_fe_trains_only_fusion_and_head(ner_dir, method):
    cfg = ner_cfg(ner_dir, method, "fe")
    state, step = state_and_step(cfg)
    model0 = model_of(state)
    assert isinstance(model0, FusedModel) and model0.frozen_backbone and model0.method == method
    batch = make_inputs()

    # The independent gradient: only fusion + head differentiated, the same dropout key as the
    # step's single micro-batch (fold_in(fold_in(key, step), 0)).
    fn, totals = ner_objective()
    key = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(state.key[0]), 0), 0)
    params, static = eqx.partition(model0, model0.trainable_spec())  # what the train step differentiates
    g = eqx.filter_jit(eqx.filter_grad(
        lambda p: fn(eqx.combine(p, static), batch, key, totals(batch))[0]))(params)
    g_leaves = jax.tree.leaves(g)
    want_norm = math.sqrt(sum(float(jnp.sum(jnp.square(x.astype(jnp.float32)))) for x in g_leaves))
    assert want_norm > 0

    # Moments (Adam's mu and nu) exist for the trainable arrays only, not for the backbone.
    n_trainable = len(jax.tree.leaves(eqx.filter(model0, model0.trainable_spec())))
    n_fusion_head = len(jax.tree.leaves(eqx.filter(fusion_and_head(model0), eqx.is_inexact_array)))
    if method == "dwatt":
        n_fusion_head -= 1  # k_pos
    assert n_trainable == n_fusion_head
    moments = [x for x in jax.tree.leaves(state.opt_state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2 * n_trainable
    assert sum(int(x.size) for x in moments) == 2 * n_elements(eqx.filter(model0, model0.trainable_spec()))

    bb0 = arrays(backbone_of(model0))
    fh0 = arrays(fusion_and_head(model0))
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(
        eqx.filter(fusion_and_head(model0), eqx.is_array))]
    kpos0 = np.asarray(model0.fusion.k_pos.value) if method == "dwatt" else None

    state, metrics = step(state, batch)
    np.testing.assert_allclose(float(metrics["grad_norm"]), want_norm, rtol=1e-5)
    for _ in range(2):
        state, _ = step(state, batch)
    assert int(state.step[0]) == 3

    bb1 = arrays(backbone_of(model_of(state)))
    assert len(bb1) == len(bb0) and all(np.array_equal(a, b) for a, b in zip(bb0, bb1))
    fh1 = arrays(fusion_and_head(model_of(state)))
    changed = [not np.array_equal(a, b) for a, b in zip(fh0, fh1)]
    # Every trainable fusion/head array moved; Base+n's attention key bias has an exactly zero
    # gradient (softmax is shift-invariant) and no weight decay, so it is left out.
    assert len(names) == len(changed)
    moved = {n: c for n, c in zip(names, changed) if not n.endswith(".attn.k.b")}
    assert moved == {n: not n.endswith(".k_pos.value") for n in moved}
    if method == "base+n":
        assert any(".layers.ff_in.w" in n for n in moved)
    if method == "dwatt":
        assert np.array_equal(np.asarray(model_of(state).fusion.k_pos.value), kpos0)


def test_base_n_fe_spec_and_update(ner_dir):
    """Base+n in FE: its fresh layers are what trains (with the head); the backbone is not."""
    cfg = ner_cfg(ner_dir, "base+n", "fe")
    model0 = init_one(cfg, make_optimizer(cfg.optim, cfg.run.steps), task_for(cfg)).model
    assert isinstance(model0.fusion, BasePlusN) and model0.fusion.n == 1
    spec = model0.trainable_spec()
    assert not any(jax.tree.leaves(spec.backbone))
    fusion_spec = jax.tree.leaves(spec.fusion)
    assert len(fusion_spec) == len(jax.tree.leaves(model0.fusion)) and all(fusion_spec)
    assert all(jax.tree.leaves(spec.head))
    # What the optimiser sees: exactly the extra layers and the head, element for element.
    n_bb, n_extra, n_head = (n_elements(model0.backbone), n_elements(model0.fusion),
                             n_elements(model0.head))
    assert n_elements(eqx.filter(model0, model0.trainable_spec())) == n_extra + n_head
    assert n_elements(model0) == n_bb + n_extra + n_head
    # (that the extra layers change under the train step: test_fe_trains_only_fusion_and_head)


def test_fe_computes_no_backbone_gradient():
    """jax.grad w.r.t. the *whole* model: in FE every backbone leaf of it is exactly zero (the
    stop_gradient in FusedModel.layer_states); in FT the backbone does get a gradient."""
    batch = make_inputs(2)
    fn, totals = ner_objective()
    enc = Encoder(ENC, key=jax.random.key(3))
    fe = FusedModel(enc, method="concat", frozen_backbone=True, n_labels=len(LABELS), rate=0.1,
                    key=jax.random.key(4))
    ft = FusedModel(enc, method="concat", frozen_backbone=False, n_labels=len(LABELS), rate=0.1,
                    key=jax.random.key(4))
    key = jax.random.key(5)

    @eqx.filter_jit
    def grads(fe, ft):
        g = lambda m: eqx.filter_grad(lambda m: fn(m, batch, key, totals(batch))[0])(m)  # noqa: E731
        return g(fe), g(ft)

    g_fe, g_ft = grads(fe, ft)
    fe_bb = arrays(g_fe.backbone)
    assert len(fe_bb) == len(arrays(enc))
    assert all(not np.any(x) for x in fe_bb)
    ft_bb = arrays(g_ft.backbone)
    assert sum(bool(np.any(x)) for x in ft_bb) >= len(ft_bb) - 1  # all but maybe attn.k.b
    # The fusion / head gradients exist in both modes. (They differ: FT runs the backbone
    # with its dropout under the key, FE without.)
    for g in (g_fe, g_ft):
        assert all(np.any(x) for x in arrays((g.head, g.fusion)))


def test_ft_trains_the_backbone_but_not_k_pos(ner_dir):
    cfg = ner_cfg(ner_dir, "dwatt", "ft")
    state, step = state_and_step(cfg)
    model0 = model_of(state)
    assert not model0.frozen_backbone
    spec = model0.trainable_spec()
    assert all(jax.tree.leaves(eqx.filter(spec.backbone, lambda x: x is not None)))
    n_trainable = len(jax.tree.leaves(eqx.filter(model0, spec)))
    moments = [x for x in jax.tree.leaves(state.opt_state) if eqx.is_inexact_array(x)]
    assert len(moments) == 2 * n_trainable
    bb0 = arrays(model0.backbone)
    kpos0 = np.asarray(model0.fusion.k_pos.value)
    batch = make_inputs(3)
    for _ in range(3):
        state, _ = step(state, batch)
    bb1 = arrays(model_of(state).backbone)
    changed = [not np.array_equal(a, b) for a, b in zip(bb0, bb1)]
    # Every backbone array is used (token-type row 0 by every token), so every one moves.
    assert all(changed), f"{sum(changed)} of {len(changed)} backbone arrays changed"
    assert np.array_equal(np.asarray(model_of(state).fusion.k_pos.value), kpos0)


# ------------------------------------------------------------- 4: gather before / gather after

@pytest.mark.parametrize("method", ["dwatt", "concat", "base", "base+n"])
def test_gather_before_equals_gather_after(method):
    inp = make_inputs(4)
    model = FusedModel(Encoder(ENC, key=jax.random.key(5)), method=method, frozen_backbone=True,
                       n_labels=len(LABELS), key=jax.random.key(6))
    model = eqx.tree_at(lambda m: m.fusion, model, randomize(model.fusion, 7))
    args = (inp["tokens"], inp["segments"], inp["mask"])

    @eqx.filter_jit
    def run(m):
        return m.features(*args), m.features(*args, inp["positions"]), m(*args, inp["positions"])

    full, at, logits = run(model)
    assert full.shape == (B, T, D) and at.shape == (B, P, D) and logits.shape == (B, P, len(LABELS))
    want = np.take_along_axis(np.asarray(full), np.asarray(inp["positions"])[..., None], axis=1)
    # Same numbers up to float32 summation order (a [B*P] rather than [B*T] row matmul).
    np.testing.assert_allclose(np.asarray(at), want, rtol=1e-5, atol=1e-6)
    want_logits = want @ np.asarray(model.head.w) + np.asarray(model.head.b)
    np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- 5: layer_states per backbone

def stacked_layer(layers, i):
    return jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, layers)


def layers_by_hand(h, layers, n: int, mask):
    """The outputs of stacked layers 0..n-1 applied one at a time from h, stacked."""
    want = []
    for i in range(n):
        h = stacked_layer(layers, i)(h, mask)
        want.append(h)
    return jnp.stack(want)


def _assert_stacked_layer_states(model, n_layers: int, inp, mode: str) -> None:
    """layer_states of a backbone with stacked layers = its layers applied one by one after its
    embedding; a Base fusion model's features = the last of them."""
    args = (inp["tokens"], inp["segments"], inp["mask"])
    fused = FusedModel(model, method="base", frozen_backbone=mode == "fe", n_labels=3,
                       key=jax.random.key(1))

    @eqx.filter_jit
    def run(model, fused):
        want = layers_by_hand(model.embed(inp["tokens"], inp["segments"]), model.layers,
                              n_layers, inp["mask"].astype(bool))
        return model.layer_states(*args), want, fused.features(*args)

    z, want, h = run(model, fused)
    assert z.shape == (n_layers, B, T, D)
    np.testing.assert_allclose(np.asarray(z), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(h), np.asarray(want[-1]), rtol=1e-5, atol=1e-5)
    assert depth_and_width(model) == (n_layers, D)


def test_layer_states_encoder():
    enc = randomize(Encoder(ENC, key=jax.random.key(8)), 9, scale=0.2)
    _assert_stacked_layer_states(enc, ENC.n_layers, make_inputs(5), "fe")
    # strip_to_backbone finds the encoder inside both an EncoderMLM and a FusedModel
    fused = FusedModel(enc, method="base", frozen_backbone=True, n_labels=3, key=jax.random.key(1))
    assert strip_to_backbone(fused) is enc
    assert strip_to_backbone(EncoderMLM(enc, key=jax.random.key(2))) is enc


@pytest.mark.parametrize("halting", ["act", "fixed"])
def test_layer_states_act(halting):
    inp = make_inputs(6)
    args = (inp["tokens"], inp["segments"], inp["mask"])
    cfg = dataclasses.replace(ACT_CFG, halting=halting)
    model = ACTEncoder(cfg, key=jax.random.key(10))
    fused = FusedModel(model, method="base", frozen_backbone=True, n_labels=3,
                       key=jax.random.key(1))

    @eqx.filter_jit
    def run(model, fused):
        if halting == "fixed":  # ALBERT: the shared layer applied M times
            h = model.embed(inp["tokens"], inp["segments"])
            want = []
            for _ in range(cfg.max_iters):
                h = model.layer(h, inp["mask"].astype(bool))
                want.append(h)
            want, last, ran = jnp.stack(want), h, jnp.int32(cfg.max_iters)
        else:  # the inference driver (while_loop, filled past its last iteration) is independent
            out = model.forward_while(*args, return_states=True)
            want, last, ran = out.states_MBTD, out.h_BTD, out.iterations_run
        return model.layer_states(*args), want, last, ran, fused.features(*args)

    z, want, last, ran, h = run(model, fused)
    assert z.shape == (cfg.max_iters, B, T, D)
    assert 1 <= int(ran) <= cfg.max_iters
    np.testing.assert_allclose(np.asarray(z), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(h), np.asarray(last), rtol=1e-5, atol=1e-5)
    assert depth_and_width(model) == (cfg.max_iters, D)


def test_layer_states_untied():
    model = UntiedEncoder(ACT_CFG, key=jax.random.key(11))
    _assert_stacked_layer_states(model, ACT_CFG.max_iters, make_inputs(7), "ft")


def test_layer_states_decoder():
    inp = make_inputs(8)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=3, d_ff=64, n_heads=2)
    model = DecoderLM(cfg, key=jax.random.key(12))
    fused = FusedModel(model, method="base", frozen_backbone=True, n_labels=3,
                       key=jax.random.key(1))

    @eqx.filter_jit
    def run(model, fused):
        x = model.embed[inp["tokens"]]
        pos = jnp.arange(T)
        bias = model.rel_bias(pos, pos)
        want = []
        for i in range(cfg.n_layers):
            x = stacked_layer(model.blocks, i)(x, bias, 0.0, None)
            want.append(x)
        return (model.layer_states(inp["tokens"], None, None), jnp.stack(want),
                model.hidden(inp["tokens"])[0], model.final_norm(x),
                fused.features(inp["tokens"], None, None))

    z, want, hidden, normed, h = run(model, fused)
    assert z.shape == (cfg.n_layers, B, T, D)
    np.testing.assert_allclose(np.asarray(z), np.asarray(want), rtol=1e-5, atol=1e-5)
    # hidden() is the final norm of the last state; features are the state before the norm
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(normed), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(h), np.asarray(want[-1]), rtol=1e-5, atol=1e-5)
    assert depth_and_width(model) == (cfg.n_layers, D)


# ------------------------------------------------------------------- 6: fusion parameter count

def base_n_by_formula(n, d, d_ff):
    attn = 4 * (d * d + d)
    return n * (attn + 2 * 2 * d + (d * d_ff + d_ff) + (d_ff * d + d))


@pytest.mark.parametrize("backbone_kind", ["encoder", "act"])
@pytest.mark.parametrize("method", ["base", "base+n", "concat", "dwatt"])
def test_param_count_matches_the_built_module(backbone_kind, method):
    if backbone_kind == "encoder":
        bb = Encoder(ENC, key=jax.random.key(13))
        L, d_ff = ENC.n_layers, ENC.d_ff
    else:
        bb = ACTEncoder(ACT_CFG, key=jax.random.key(13))
        L, d_ff = ACT_CFG.max_iters, ACT_CFG.d_ff
    n_extra = 2
    model = FusedModel(bb, method=method, frozen_backbone=True, n_labels=5, n_extra=n_extra,
                       key=jax.random.key(14))
    count = fusion_method(method).param_count(bb, n_extra)
    if method == "base":
        assert isinstance(model.fusion, Base) and count == 0
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

def mlm_model_and_inputs():
    inp = make_inputs(9)
    enc = Encoder(ENC, key=jax.random.key(15))
    model = EncoderMLM(enc, key=jax.random.key(16))
    model = eqx.tree_at(lambda m: m.head, model, randomize(model.head, 17))
    return model, inp


def test_encoder_mlm_masked_logits_match_numpy():
    model, inp = mlm_model_and_inputs()
    enc, hd = model.encoder, model.head
    args = (inp["tokens"], inp["segments"], inp["mask"])
    fused = FusedModel(enc, method="base", frozen_backbone=True, mlm=True, key=jax.random.key(18))
    fused = eqx.tree_at(lambda m: m.head, fused, hd)

    @eqx.filter_jit
    def run(model, fused):
        return (model.masked_logits(*args, inp["positions"]),  # under strict rank promotion
                fused.masked_logits(*args, inp["positions"]),
                enc(inp["tokens"], inp["mask"], inp["segments"])[0])

    logits, fused_logits, h = run(model, fused)
    assert logits.shape == (B, P, V) and logits.dtype == jnp.float32

    f = lambda a: np.asarray(a, np.float64)  # noqa: E731
    pos = np.asarray(inp["positions"])
    x = f(h)[np.arange(B)[:, None], pos]  # [B, P, D]
    u = x @ f(hd.dense.w) + f(hd.dense.b)
    u = 0.5 * u * (1.0 + np.vectorize(math.erf)(u / math.sqrt(2.0)))  # exact gelu
    mean = u.mean(-1, keepdims=True)
    var = ((u - mean) ** 2).mean(-1, keepdims=True)
    u = (u - mean) / np.sqrt(var + ENC.layer_norm_eps) * f(hd.norm.scale) + f(hd.norm.bias)
    want = u @ f(enc.embed.word_VD).T + f(hd.bias_V)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)
    # The fusion model's MLM head (Base, FE) on the same encoder and head: the same logits.
    np.testing.assert_allclose(np.asarray(fused_logits), want, rtol=1e-5, atol=1e-5)
    # gather_positions is that gather
    np.testing.assert_array_equal(np.asarray(gather_positions(h, inp["positions"])),
                                  x.astype(np.float32))


@pytest.mark.parametrize("arch", ["act", "albert", "bert", "decoder", "encoder"])
def test_base_n_layer_copies_the_backbone_activation_and_eps(arch):
    """Base+n's fresh layers use the backbone's own activation and norm eps: ALBERT's tanh GELU
    (eps 1e-12) on the ACT / ALBERT / untied encoders, T5.1.1's tanh GELU (eps 1e-6) on the
    decoder, the config's on a BERT/RoBERTa encoder (here RoBERTa-like: relu, eps 1e-5)."""
    key = jax.random.key(0)
    if arch == "decoder":
        backbone = DecoderLM(ModelConfig(vocab_size=64, d_model=32, n_layers=2, d_ff=48), key=key)
        want = ("gelu_new", 1e-6)
    elif arch == "encoder":
        backbone = Encoder(EncoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=48,
                                         max_positions=16, layer_norm_eps=1e-5, activation="relu"),
                           key=key)
        want = ("relu", 1e-5)
    else:
        cfg = ACTConfig(vocab_size=64, embed_dim=16, d_model=32, n_heads=2, max_len=16, max_iters=2)
        backbone = (UntiedEncoder if arch == "bert" else ACTEncoder)(cfg, key=key)
        want = ("gelu_new", 1e-12)
    extra = BasePlusN(2, backbone.post_ln_layer, key=key)
    got = (extra.layers.activation, extra.layers.attn_norm.eps, extra.layers.ff_norm.eps)
    assert got == (want[0], want[1], want[1])
    # and the layer computes with that activation: tanh GELU differs from the exact one
    x = jax.random.normal(jax.random.key(1), (1, 4, 32))
    mask = jnp.ones((1, 4), bool)
    layer = randomize(jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, extra.layers), 3,
                      scale=1.0)  # weights large enough for the two GELUs to part
    other = "gelu" if want[0] != "gelu" else "relu"
    swapped = copy.copy(layer)
    object.__setattr__(swapped, "activation", other)  # a static field: same weights
    assert not np.allclose(np.asarray(layer(x, mask)), np.asarray(swapped(x, mask)))


def test_pretrained_weights_enter_the_sharded_init(ner_dir, caplog):
    """Task.initial_model's weights go into the jitted init (trainer/state.py initialise):
    the state holds them exactly, fresh arrays elsewhere, optimizer moments for them (FT),
    and every leaf is committed to the state's sharding (else the step compiles twice)."""
    from jaxdepth.trainer.state import abstract_model, initialise, make_step

    cfg = ner_cfg(ner_dir, "dwatt", "ft")
    mesh = make_mesh(cfg.mesh)
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    task = task_for(cfg)
    abstract, sh = state_shardings([cfg], tx, mesh, task)
    fresh = init_one(cfg, tx, task)
    backbone = randomize(fresh.model.backbone, seed=7)  # stands for pretrained weights
    state = initialise([cfg], tx, task, sh,
                       eqx.tree_at(lambda m: m.backbone, abstract_model(abstract), backbone))
    for got, want in zip(arrays(model_of(state).backbone), arrays(backbone)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(arrays(fusion_and_head(model_of(state))),
                         arrays(fusion_and_head(fresh.model))):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(arrays(backbone)[0], arrays(fresh.model.backbone)[0])
    want = eqx.tree_at(lambda m: m.backbone, fresh.model, backbone)
    want_opt = tx.init(eqx.filter(want, want.trainable_spec()))
    for got, w in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(want_opt)):
        np.testing.assert_allclose(np.asarray(got)[0], np.asarray(w), rtol=1e-6, atol=1e-7)
    # the step takes the state as its own outputs come: one compilation for two steps
    step = make_step([cfg], mesh, sh, [task])
    stacked = lambda b: {k: v[None] for k, v in b.items()}  # noqa: E731  (one trial's axis)
    with jax.log_compiles():
        with caplog.at_level(logging.WARNING):
            state, _ = step(state, stacked(make_inputs()))
            step(state, stacked(make_inputs(1)))
    assert sum("jit(step)" in r.getMessage() and "Finished XLA compilation" in r.getMessage()
               for r in caplog.records) == 1
