"""model.d_ff_multiple: the decoder's feed-forward blocks computed with d_ff zero-padded (an
odd Eq. 1 width up to a multiple of 128) give the unpadded model's logits, loss, gradients and
training trajectory, while the stored weights, parameter count and FLOPs stay unpadded."""
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdepth.config import ModelConfig, OptimConfig
from jaxdepth.models.depth_family import depth_family, param_count
from jaxdepth.errors import ConfigError
from jaxdepth.models.decoder import DecoderLM, padded_d_ff
from jaxdepth.models.flops import train_flops_per_token
from jaxdepth.tasks.losses import lm_loss_sums
from jaxdepth.optim import make_optimizer

# tiny-L4: d_model 64, 4 layers, Eq. 1's d_ff 85; d_ff_multiple 1 is the unpadded reference.
CFG = dataclasses.replace(depth_family("tiny")[4], d_ff_multiple=1)
PADDED = 128
T = 16


def padded(model: DecoderLM) -> DecoderLM:
    return model.with_options(d_ff_multiple=PADDED)


@pytest.fixture(scope="module")
def model():
    return DecoderLM(CFG, key=jax.random.key(0))


@pytest.fixture(scope="module")
def seqs():
    return jax.random.randint(jax.random.key(1), (4, T + 1), 2, CFG.vocab_size, jnp.int32)


def loss_fn(params, static, seqs, key=None):
    logits = eqx.combine(params, static)(seqs[:, :-1], key=key)
    obj, _, n = lm_loss_sums(logits, seqs[:, 1:], jnp.ones(seqs[:, 1:].shape, jnp.float32))
    return obj / n, logits


@eqx.filter_jit
def loss_grad(model, seqs, key=None):
    params, static = eqx.partition(model, eqx.is_array)
    return jax.value_and_grad(loss_fn, has_aux=True)(params, static, seqs, key)


def test_padding_is_computed_and_weights_stay_unpadded(model):
    assert CFG.d_ff == 85 and padded_d_ff(CFG) == 85
    assert padded_d_ff(padded(model).cfg) == 128
    mlp = padded(model).compute_blocks().mlp
    assert (mlp.wi_0.shape, mlp.wi_1.shape, mlp.wo.shape) == ((4, 64, 128),) * 2 + ((4, 128, 64),)
    # the padding is zeros and the real entries are the stored weights
    np.testing.assert_array_equal(np.asarray(mlp.wi_0[..., 85:]), 0)
    np.testing.assert_array_equal(np.asarray(mlp.wo[:, 85:]), 0)
    np.testing.assert_array_equal(np.asarray(mlp.wo[:, :85]), np.asarray(model.blocks.mlp.wo))
    assert padded(model).blocks.mlp.wo.shape == (4, 85, 64)


def test_padded_logits_and_loss_equal_unpadded(model, seqs):
    (loss, logits), _ = loss_grad(model, seqs)
    (loss_p, logits_p), _ = loss_grad(padded(model), seqs)
    logits, logits_p = np.asarray(logits), np.asarray(logits_p)
    assert np.abs(logits).max() > 0.1  # a non-trivial reference
    np.testing.assert_allclose(logits_p, logits, rtol=0, atol=1e-6 * np.abs(logits).max())
    np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-6)


def test_padded_dropout_drops_the_unpadded_units(model, seqs):
    key = jax.random.key(5)
    (_, ref), _ = loss_grad(model.with_options(dropout=0.2), seqs, key)
    (_, got), _ = loss_grad(padded(model).with_options(dropout=0.2), seqs, key)
    (_, undropped), _ = loss_grad(model, seqs)
    ref, got = np.asarray(ref), np.asarray(got)
    assert np.abs(ref - np.asarray(undropped)).max() > 1e-2  # dropout acts
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * np.abs(ref).max())


def test_padded_gradients_equal_unpadded_with_unpadded_shapes(model, seqs):
    _, grads = loss_grad(model, seqs)
    _, grads_p = loss_grad(padded(model), seqs)
    assert grads_p.blocks.mlp.wi_0.shape == (4, 64, 85)
    assert grads_p.blocks.mlp.wo.shape == (4, 85, 64)
    for g, gp in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True):
        assert gp.shape == g.shape
        scale = float(np.abs(np.asarray(g)).max())
        np.testing.assert_allclose(np.asarray(gp), np.asarray(g), rtol=0, atol=1e-5 * scale)
    assert float(np.abs(np.asarray(grads.blocks.mlp.wo)).max()) > 1e-4


# Adam divides each gradient entry by its own RMS, so a rounding-level difference in a near-zero
# entry (XLA sums the 85- and 128-wide products in different orders) moves that parameter by
# up to lr a step: AdamW's params get a looser tolerance, as wide as the spread between the
# scanned and the unrolled unpadded model (measured: 1e-4 of a tensor's largest entry both
# ways). Adafactor's factored, parameter-relative steps keep it within 1e-6.
@pytest.mark.parametrize("name, lr, param_atol", [("adafactor", 1e-2, 1e-5), ("adamw", 1e-3, 1e-3)])
def test_padded_training_trajectory_equals_unpadded(model, seqs, name, lr, param_atol):
    """Eight steps with dropout: the optimizer sees the unpadded parameters and gradients, so
    Adafactor's factored statistics and parameter-relative steps are the unpadded run's."""
    opt = make_optimizer(OptimConfig(name=name, lr=lr, schedule="constant", warmup_steps=0,
                                     clip_norm=0.0), total_steps=8)

    @eqx.filter_jit
    def train(model):
        params, static = eqx.partition(model, eqx.is_array)

        def step(carry, key):
            p, s = carry
            (val, _), g = jax.value_and_grad(loss_fn, has_aux=True)(p, static, seqs, key)
            upd, s = opt.update(g, s, p)
            return (optax.apply_updates(p, upd), s), val

        keys = jax.random.split(jax.random.key(9), 8)
        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), keys)
        return losses, params

    losses, params = train(model.with_options(dropout=0.1))
    losses_p, params_p = train(padded(model).with_options(dropout=0.1))
    losses = np.asarray(losses)
    assert losses[-1] < losses[0] - 0.1  # it trains
    np.testing.assert_allclose(np.asarray(losses_p), losses, rtol=1e-5)
    assert params_p.blocks.mlp.wi_1.shape == (4, 64, 85)
    for a, b in zip(jax.tree.leaves(params_p), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                   atol=param_atol * float(np.abs(np.asarray(b)).max()))


def test_param_count_and_flops_stay_unpadded(model):
    p = padded(model)
    stored = sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(p, eqx.is_array)))
    assert stored == p.param_count() == param_count(CFG) == 196_960  # docs/design.md §2.2
    # 6 * (4 * (3*64*85 + 4*64*64) + 64*512) + 12 * 4 * T * 64, d_ff 85 and not 128
    assert p.flops_per_token(T) == train_flops_per_token(CFG, T) == 1_030_656


def test_auto_pads_to_128_off_the_cpu_only(monkeypatch):
    auto = ModelConfig(d_model=768, d_ff=35847)  # 134M-L1
    assert auto.d_ff_multiple == -1
    assert padded_d_ff(auto) == 35847  # the tests run on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert padded_d_ff(auto) == 35968 == 281 * 128
    assert padded_d_ff(ModelConfig(d_model=768, d_ff=2048)) == 2048
    assert padded_d_ff(ModelConfig(d_model=768, d_ff=35847, d_ff_multiple=1)) == 35847
    assert padded_d_ff(ModelConfig(d_model=768, d_ff=35847, d_ff_multiple=256)) == 36096


@pytest.mark.parametrize("value", [0, -2])
def test_d_ff_multiple_is_validated(value):
    with pytest.raises(ConfigError, match=rf"^model.d_ff_multiple: must be -1 or positive, "
                                          rf"got {value}$"):
        ModelConfig(d_ff_multiple=value)
