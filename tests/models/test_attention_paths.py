"""model.attention: the decoder's attention through jax.nn.dot_product_attention agrees with
the einsum reference (logits and gradients, float32 and bf16); the option is validated, is a
run-time option (same weights, resumable), and a bf16 train step keeps float32 parameters,
optimizer state and loss."""
import contextlib
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config.cli import parse_args
from jaxdepth.config import Config, ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.tasks import task_for
from jaxdepth.trainer.restore import check_compatible
from jaxdepth.tasks.losses import lm_loss_sums
from jaxdepth.trainer.sharding import batch_sharding, make_mesh
from jaxdepth.trainer.state import start


def bf16_grad_promotion(compute_dtype: str = "bfloat16"):
    """jax 0.10 lowers the backward of dot_product_attention's bf16 XLA path with a dot of
    float32 and bf16 operands whose lowering calls promote_types, which the tests' strict
    promotion refuses (a jax limitation; train.py runs under standard promotion). Only the calls
    that take bf16 gradients run under standard promotion, the einsum reference with them."""
    if compute_dtype != "bfloat16":
        return contextlib.nullcontext()
    return jax.numpy_dtype_promotion("standard")


CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, d_ff=64, n_heads=2)
B, T = 2, 16


@pytest.fixture(scope="module")
def model():
    m = DecoderLM(CFG, key=jax.random.key(0))
    # A larger position-bias table than the init's (|x| <= ~0.4), so a path that dropped or
    # misplaced the bias would move the logits far beyond the tolerances below.
    table = 2.0 * jax.random.normal(jax.random.key(1), m.rel_bias.table.shape, jnp.float32)
    return eqx.tree_at(lambda m: m.rel_bias.table, m, table)


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(2), (B, T + 1), 0, CFG.vocab_size, jnp.int32)


@eqx.filter_jit
def logits_of(model, tokens):
    return model(tokens[:, :-1])


@eqx.filter_jit
def loss_and_grads(model, tokens):
    def loss(m):
        logits = m(tokens[:, :-1])
        _, nll, n = lm_loss_sums(logits, tokens[:, 1:], jnp.ones((B, T), jnp.float32))
        return nll / n
    return eqx.filter_value_and_grad(loss)(model)


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def test_the_option_reaches_the_attention(model, tokens, monkeypatch):
    """dot_product really calls jax.nn.dot_product_attention (scale 1, causal, one [1,N,T,T]
    bias); einsum does not. Otherwise the comparisons below would compare einsum with itself."""
    calls = []
    real = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    jax.eval_shape(lambda m, t: m(t), model, tokens[:, :-1])
    assert calls == []
    jax.eval_shape(lambda m, t: m(t), model.with_options(attention="dot_product"), tokens[:, :-1])
    assert len(calls) == 1  # traced once: the layers run under lax.scan
    kw = calls[0]
    assert kw["scale"] == 1.0 and kw["is_causal"] and kw["implementation"] is None
    assert kw["bias"].shape == (1, CFG.heads, T, T) and kw.get("mask") is None


@pytest.mark.parametrize("scan", [True, False])
def test_float32_logits_and_gradients_match_einsum(model, tokens, scan):
    ref = model.with_options(scan_layers=scan)
    dot = ref.with_options(attention="dot_product")
    l_ref, l_dot = logits_of(ref, tokens), logits_of(dot, tokens)
    assert l_dot.dtype == jnp.float32
    assert max_abs(l_ref, l_dot) <= 1e-5
    (v_ref, g_ref), (v_dot, g_dot) = loss_and_grads(ref, tokens), loss_and_grads(dot, tokens)
    assert abs(float(v_ref) - float(v_dot)) <= 1e-5
    leaves_ref, leaves_dot = (jax.tree.leaves(eqx.filter(g, eqx.is_array))
                              for g in (g_ref, g_dot))
    assert len(leaves_ref) == len(leaves_dot) == 13  # embed, 9 per block, bias, norm, head
    for a, b in zip(leaves_ref, leaves_dot):
        assert max_abs(a, b) <= 1e-5
    # the bias gradient is really compared (it flows through dot_product_attention's bias)
    assert float(jnp.abs(g_ref.rel_bias.table).max()) > 1e-3


def test_bf16_logits_and_gradients_match_einsum(model, tokens):
    """Both paths compute in bf16 with float32 logits and softmax, so they round at the same
    places (q k^T accumulates in float32; the probabilities are cast to bf16 before p v); only
    XLA's choice of fusion and summation order may differ (on this CPU they agree bit for bit;
    the bar is for other backends). A bf16 rounding is at most 2^-9 relative, so a stray one in
    an attention output, carried through two residual layers and the 32-term head, moves a
    logit by well under 2^-7 of the logit scale. The bar is that, and it is far below the
    bf16-vs-float32 difference, which is checked to be real."""
    ref16 = model.with_options(compute_dtype="bfloat16")
    dot16 = ref16.with_options(attention="dot_product")
    l32 = logits_of(model, tokens)
    l_ref, l_dot = logits_of(ref16, tokens), logits_of(dot16, tokens)
    assert l_ref.dtype == l_dot.dtype == jnp.float32
    scale = float(jnp.abs(l32).max())
    diff = max_abs(l_ref, l_dot)
    assert diff <= 2 ** -7 * scale, (diff, scale)
    assert max_abs(l_ref, l32) > 1e-4 * scale  # the bf16 models really computed in bf16
    assert diff <= 0.25 * max_abs(l_ref, l32)  # the paths agree far better than bf16 vs f32
    with bf16_grad_promotion():
        v_ref, g_ref = loss_and_grads(ref16, tokens)
        v_dot, g_dot = loss_and_grads(dot16, tokens)
    assert v_dot.dtype == jnp.float32
    assert abs(float(v_ref) - float(v_dot)) <= 2 ** -7 * abs(float(v_ref))
    for a, b in zip(jax.tree.leaves(eqx.filter(g_ref, eqx.is_array)),
                    jax.tree.leaves(eqx.filter(g_dot, eqx.is_array))):
        assert a.dtype == b.dtype == jnp.float32  # gradients of float32 parameters
        assert max_abs(a, b) <= 2 ** -6 * float(jnp.abs(a).max()) + 1e-6


def test_kv_cache_decoding_is_unchanged_by_the_option(model, tokens):
    """Decoding stays on einsum (per-example masks over the cache): the option changes nothing."""
    dot = model.with_options(attention="dot_product")
    cache = model.init_cache(B, T)
    a, _ = eqx.filter_jit(lambda m, t, c: m.extend(t, c))(model, tokens[:, :T], cache)
    b, _ = eqx.filter_jit(lambda m, t, c: m.extend(t, c))(dot, tokens[:, :T], cache)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and extend over a whole prompt is the training forward of the dot_product path
    assert max_abs(a, logits_of(dot, tokens)) <= 1e-5


# ----------------------------------------------------------------------------- the option

@pytest.mark.parametrize("make,needle", [
    (lambda: ModelConfig(attention="flash"),
     "must be one of einsum, dot_product, cudnn, got 'flash'"),
    (lambda: ModelConfig(attention="cudnn"), "compute_dtype bfloat16"),
    (lambda: parse_args(["--model.attention", "sdpa"]), "got 'sdpa'"),
])
def test_config_refuses_bad_attention_naming_the_field(make, needle):
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value).startswith("model.attention:") and needle in str(e.value), str(e.value)
    assert e.value.field == "model.attention"


def test_attention_is_a_run_time_option(model, tmp_path):
    cfg = parse_args(["--model.attention", "dot_product"])
    assert cfg.model.attention == "dot_product" and Config().model.attention == "einsum"
    assert "attention" not in ModelConfig.SHAPE
    assert ModelConfig(attention="cudnn", compute_dtype="bfloat16").attention == "cudnn"
    dot = model.with_options(attention="dot_product")  # same weights, no shape change
    assert dot.embed is model.embed and dot.cfg.attention == "dot_product"
    # a run may resume with another attention path (it does not change the weights)
    check_compatible(Config().to_dict(), cfg, tmp_path)


# ----------------------------------------------------------------------------- bf16 end to end

def test_bf16_train_step_keeps_float32_params_optimizer_state_and_loss():
    """One real train step (as train.py builds it, on one device) with bf16 compute and
    the dot_product attention: the loss is float32 and close to the float32 model's, and the
    parameters and AdamW moments stay float32 after the update."""
    def one_step(model_cfg):
        cfg = Config(model=model_cfg, data=DataConfig(seq_len=T, batch_size=8),
                     optim=OptimConfig(name="adamw", lr=1e-3, schedule="constant", warmup_steps=0),
                     run=RunConfig(steps=1))
        mesh = make_mesh(cfg.mesh)
        state, step, _ = start([cfg], [task_for(cfg)], mesh)  # one trial, on its trial axis
        before = jax.tree.map(np.asarray, eqx.filter(state.model, eqx.is_array))
        toks = np.random.default_rng(0).integers(3, CFG.vocab_size, (1, 8, T + 1),
                                                 dtype=np.int32)
        batch = {"inputs": toks[..., :-1], "targets": toks[..., 1:],
                 "weights": np.ones((1, 8, T), np.float32)}
        batch = {k: jax.device_put(v, batch_sharding(mesh, 1)) for k, v in batch.items()}
        with bf16_grad_promotion(model_cfg.compute_dtype):
            state, metrics = step(state, batch)
        return before, state, {k: v[0] for k, v in metrics.items()}

    _, _, m32 = one_step(CFG)
    before, state, m16 = one_step(
        dataclasses.replace(CFG, compute_dtype="bfloat16", attention="dot_product"))
    loss16, loss32 = m16["loss"], float(m32["loss"])
    assert loss16.dtype == jnp.float32 and np.isfinite(float(loss16))
    assert 0 < abs(float(loss16) - loss32) <= 2 ** -6 * loss32  # bf16 compute, float32 loss
    params = jax.tree.leaves(eqx.filter(state.model, eqx.is_array))
    assert params and all(p.dtype == jnp.float32 for p in params)
    moments = [x for x in jax.tree.leaves(state.opt_state)
               if jnp.issubdtype(x.dtype, jnp.floating)]
    assert moments and all(x.dtype == jnp.float32 for x in moments)
    # the step really updated the float32 parameters
    moved = [not np.array_equal(a, np.asarray(b))
             for a, b in zip(jax.tree.leaves(before), params)]
    assert all(moved)
