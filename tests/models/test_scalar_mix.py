"""ScalarMix (models/fusions/scalar_mix.py) against NumPy, as a registered fusion method."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.models.specs import EncoderConfig
from jaxdepth.models.encoder import Encoder
from jaxdepth.models.fused import FusedModel
from jaxdepth.models.fusions import fusion_method, fusion_methods
from jaxdepth.models.fusions.scalar_mix import ScalarMix

L, B, T, D = 3, 2, 5, 8


def test_mix_matches_numpy(getkey):
    z = np.asarray(jax.random.normal(getkey(), (L, B, T, D)), np.float32)
    s, gamma = np.array([0.3, -1.2, 2.0], np.float32), np.float32(0.7)
    mix = eqx.tree_at(lambda m: (m.s, m.gamma), ScalarMix(L, D, key=getkey()),
                      (jnp.asarray(s), jnp.asarray(gamma)))
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    want = gamma * np.einsum("l,lbtd->btd", w, z)
    np.testing.assert_allclose(np.asarray(mix(jnp.asarray(z))), want, rtol=1e-6, atol=1e-6)
    # at initialisation: the mean of the layers
    fresh = ScalarMix(L, D, key=getkey())
    np.testing.assert_allclose(np.asarray(fresh(jnp.asarray(z))), z.mean(0), rtol=1e-6, atol=1e-6)


def test_a_fusion_method_of_the_grid_that_trains_l_plus_one_parameters(getkey):
    assert "scalar_mix" in fusion_methods()
    cfg = EncoderConfig(vocab_size=30, d_model=D, n_layers=L, n_heads=2, d_ff=16, max_positions=T)
    model = FusedModel(Encoder(cfg, key=getkey()), method="scalar_mix", frozen_backbone=True,
                       n_labels=4, key=getkey())
    assert fusion_method("scalar_mix").param_count(model.backbone, 1) == L + 1
    tokens = jax.random.randint(getkey(), (B, T), 0, 30)
    mask = jnp.ones((B, T), bool)

    def loss(m):
        return jnp.sum(m(tokens, None, mask) ** 2)

    grads = eqx.filter_grad(loss)(model)
    spec = model.trainable_spec()
    assert spec.fusion.s and spec.fusion.gamma and not any(jax.tree.leaves(spec.backbone))
    assert np.abs(np.asarray(grads.fusion.s)).sum() > 0 and float(grads.fusion.gamma) != 0.0
