"""Layer fusion (docs/design.md §4) against float64 NumPy references written from the equations."""
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.models.fusions import fusion_trainable
from jaxdepth.models.fusions.concat import Concat
from jaxdepth.models.fusions.dwatt import KEY_DIM, DWAtt

L, D, B, T = 4, 16, 2, 3
EPS = 1e-12  # LayerNorm eps of jaxdepth.models.layers.LayerNorm


def randomize(module, seed):
    """Every floating leaf (biases and LN scales too) set to random values, so none is trivial."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0.0, 0.4, x.shape), x.dtype)
        if eqx.is_inexact_array(x) else x, module)


def f64(x):
    return np.asarray(x, np.float64)


def ln_ref(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * scale + bias


def gelu_ref(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def bottleneck_ref(p, x):
    """f(x) = W · LN(gelu(U x)), written out with plain arrays."""
    u = x @ p["U"] + p["bU"]
    return ln_ref(gelu_ref(u), p["s"], p["b"]) @ p["W"] + p["bW"]


def bottleneck_params(f, n=None):
    pick = (lambda a: f64(a)) if n is None else (lambda a: f64(a[n]))
    return {"U": pick(f.up.w), "bU": pick(f.up.b), "s": pick(f.norm.scale),
            "b": pick(f.norm.bias), "W": pick(f.down.w), "bW": pick(f.down.b)}


def dwatt_ref(m, z):
    """Returns (h, alpha) for z [L, B, T, D] in float64."""
    z_last = z[-1]
    s = z_last + bottleneck_ref(bottleneck_params(m.query), z_last)
    q = 1.0 + np.where(s > 0, s, np.expm1(s))  # 1 + elu(s)
    k = f64(m.k_pos.value) @ f64(m.key_proj.w) + f64(m.key_proj.b)  # [L, D]
    logits = np.stack([(q * k[n]).sum(-1) for n in range(L)], axis=-1)  # [B, T, L]
    alpha = np.exp(logits - logits.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    h = z_last.copy()
    for n in range(L):
        v = ln_ref(bottleneck_ref(bottleneck_params(m.values.f, n), z[n]),
                   f64(m.values.norm.scale[n]), f64(m.values.norm.bias[n]))
        h += alpha[..., n:n + 1] * v
    return h, alpha


@pytest.fixture
def z():
    return np.random.default_rng(1).normal(0.0, 1.0, (L, B, T, D)).astype(np.float32)


def test_dwatt_matches_reference(getkey, z):
    m = randomize(DWAtt(L, D, key=getkey()), seed=2)
    h_ref, alpha_ref = dwatt_ref(m, f64(z))
    h = eqx.filter_jit(m)(jnp.asarray(z))
    assert h.shape == (B, T, D) and h.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(h), h_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(eqx.filter_jit(m.attention_weights)(jnp.asarray(z))),
                               alpha_ref,
                               rtol=1e-5, atol=1e-5)


def test_dwatt_zero_values_is_identity(getkey, z):
    m = randomize(DWAtt(L, D, key=getkey()), seed=3)
    # f_V_n(z) = 0 (W and its bias zero) and LN_n(0) = bias = 0, so v_n = 0 and h = z_L.
    m = eqx.tree_at(lambda t: (t.values.f.down.w, t.values.f.down.b, t.values.norm.bias),
                    m, replace_fn=jnp.zeros_like)
    h = eqx.filter_jit(m)(jnp.asarray(z))
    np.testing.assert_array_equal(np.asarray(h), z[-1])


def test_dwatt_attention_is_a_distribution_over_layers(getkey, z):
    m = randomize(DWAtt(L, D, key=getkey()), seed=4)
    alpha = np.asarray(eqx.filter_jit(m.attention_weights)(jnp.asarray(z)))
    assert alpha.shape == (B, T, L)
    assert (alpha > 0).all()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)


def test_dwatt_key_positions_are_frozen(getkey, z):
    m = DWAtt(L, D, key=getkey())
    k_pos = np.asarray(m.k_pos.value)
    assert k_pos.shape == (L, 24) and (k_pos >= 0).all() and (k_pos < 1).all()
    # Not in the trainable partition...
    params, rest = eqx.partition(m, fusion_trainable(m))
    assert params.k_pos.value is None
    np.testing.assert_array_equal(np.asarray(rest.k_pos.value), k_pos)
    assert params.key_proj.w is not None and params.values.f.up.w is not None
    # ...and no gradient through it even when differentiating every array.
    grads = eqx.filter_jit(eqx.filter_grad(lambda mod: jnp.sum(mod(jnp.asarray(z)) ** 2)))(m)
    assert np.all(np.asarray(grads.k_pos.value) == 0.0)
    assert np.any(np.asarray(grads.key_proj.w) != 0.0)  # the keys do get gradient


def test_concat_matches_reference(getkey, z):
    m = randomize(Concat(L, D, key=getkey()), seed=5)
    W, b = f64(m.proj.w), f64(m.proj.b)
    # h = sum_n W_n z_n + b, with W_n the n-th d x d block of the [L*d, d] weight.
    h_ref = sum(f64(z[n]) @ W[n * D:(n + 1) * D] for n in range(L)) + b
    h = eqx.filter_jit(m)(jnp.asarray(z))
    assert h.shape == (B, T, D)
    np.testing.assert_allclose(np.asarray(h), h_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [DWAtt, Concat])
def test_fusion_runs_in_input_dtype(getkey, z, cls):
    m = cls(L, D, key=getkey())
    h = eqx.filter_jit(m)(jnp.asarray(z, jnp.bfloat16))
    assert h.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(h)))


@pytest.mark.parametrize("cls", [DWAtt, Concat])
def test_wrong_layer_count_is_an_error(getkey, z, cls):
    with pytest.raises(ValueError, match=r"\[4, B, T, 16\], got \(3, 2, 3, 16\)"):
        eqx.filter_jit(cls(L, D, key=getkey()))(jnp.asarray(z[:3]))


def added_params(kind, n_layers, d_model, key_dim=KEY_DIM):
    """Trainable parameters a fusion module adds (the paper's Table 2), counted from the
    equations of docs/design.md §4.6: with m = d // 2, one bottleneck f has U (d*m + m), LN over
    m (2m) and W (m*d + d); DWAtt adds L value maps (f_V_n plus LN_n over d), one query map f_Q
    and W_K (key_dim*d + d), its L*key_dim frozen key positions not counted; Concat L*d*d
    weights and a d bias."""
    d, m, L = d_model, d_model // 2, n_layers
    bottleneck = (d * m + m) + 2 * m + (m * d + d)
    return {"dwatt": L * (bottleneck + 2 * d) + bottleneck + (key_dim * d + d),
            "concat": L * d * d + d}[kind]


def n_trainable(module):
    return sum(math.prod(x.shape)
               for x in jax.tree.leaves(eqx.filter(module, fusion_trainable(module))))


@pytest.mark.parametrize("cls,kind", [(DWAtt, "dwatt"), (Concat, "concat")])
def test_added_params_matches_built_module(getkey, cls, kind):
    m = cls(L, D, key=getkey())
    assert added_params(kind, L, D) == n_trainable(m)
    # The abstract build used below for other sizes has the same trainable leaves.
    assert n_trainable(eqx.filter_eval_shape(cls, L, D, key=getkey())) == n_trainable(m)


@pytest.mark.parametrize("n_layers,d_model", [(2, 8), (6, 10), (12, 64), (24, 1024)])
def test_added_params_matches_module_shapes(getkey, n_layers, d_model):
    # eval_shape builds the module's pytree without allocating or compiling anything.
    for cls, kind in [(DWAtt, "dwatt"), (Concat, "concat")]:
        abstract = eqx.filter_eval_shape(cls, n_layers, d_model, key=getkey())
        assert added_params(kind, n_layers, d_model) == n_trainable(abstract)


def test_added_params_table_values():
    # BERT-base sized (L=12, d=768), counted by hand:
    #   f = U (768*384 + 384) + LN (2*384) + W (384*768 + 768) = 591744
    #   DWAtt = 12 * (f + LN_n 2*768) + f_Q f + W_K (24*768 + 768) = 7730304
    #   Concat = 12*768*768 + 768 = 7078656
    assert added_params("dwatt", 12, 768) == 7730304
    assert added_params("concat", 12, 768) == 7078656
