"""Lion (jaxdepth/optim.py) against a NumPy transcription of Chen et al. 2023's
Algorithm 2, through make_optimizer (schedule, decay mask, trial values), and its settings."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config.cli import parse_args
from jaxdepth.config import ConfigError, OptimConfig
from jaxdepth.models.declared import Declared
from jaxdepth.optim import make_optimizer


class Tiny(Declared):
    w: jax.Array  # decays
    norm_scale: jax.Array  # declared not to decay, as a norm's scale (models/declared.py)
    NO_DECAY = frozenset({"norm_scale"})


def numpy_lion(params, grads, lr, b1, b2, wd, decays):
    """Algorithm 2: c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p); m = b2 m + (1 - b2) g."""
    p = [np.array(x, np.float64) for x in params]
    m = [np.zeros_like(x) for x in p]
    out = []
    for g_step in grads:
        for i, g in enumerate(g_step):
            c = b1 * m[i] + (1 - b1) * g
            p[i] = p[i] - lr * (np.sign(c) + (wd * p[i] if decays[i] else 0.0))
            m[i] = b2 * m[i] + (1 - b2) * g
        out.append([x.copy() for x in p])
    return out


@pytest.mark.parametrize("trial_values", [False, True])
def test_lion_matches_the_papers_algorithm(trial_values):
    rng = np.random.default_rng(0)
    params = Tiny(jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                  jnp.asarray(rng.normal(size=(3,)), jnp.float32))
    grads = [[rng.normal(size=(4, 3)), rng.normal(size=(3,))] for _ in range(6)]
    cfg = OptimConfig(name="lion", lr=3e-3, schedule="constant", warmup_steps=0,
                      weight_decay=0.5, clip_norm=0.0)
    assert (cfg.b1, cfg.b2, cfg.eps) == (0.9, 0.99, None)  # the lm recipe's; no eps
    # a trial's values arrive as arrays (trainer/trials.py); here they equal cfg's
    kw = dict(lr=jnp.float32(3e-3), weight_decay=jnp.float32(0.5)) if trial_values else {}
    opt = make_optimizer(cfg, total_steps=10, **kw)
    state = opt.init(params)

    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return eqx.apply_updates(p, u), s

    want = numpy_lion([params.w, params.norm_scale], grads, 3e-3, 0.9, 0.99, 0.5, [True, False])
    p = params
    for g, w in zip(grads, want):
        p, state = step(p, state, Tiny(jnp.asarray(g[0], jnp.float32), jnp.asarray(g[1], jnp.float32)))
        np.testing.assert_allclose(np.asarray(p.w), w[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(p.norm_scale), w[1], rtol=1e-5, atol=1e-6)


def test_lion_settings():
    ner = ["--task.name", "ner", "--task.dir", "x"]
    cfg = parse_args(ner + ["--optim.name", "lion", "--optim.lr", "1e-4", "--optim.b2", "0.98"])
    assert (cfg.optim.name, cfg.optim.b1, cfg.optim.b2, cfg.optim.eps) == ("lion", 0.9, 0.98, None)
    with pytest.raises(ConfigError, match=r"^optim\.eps: optim\.name lion does not read it"):
        parse_args(ner + ["--optim.name", "lion", "--optim.lr", "1e-4", "--optim.eps", "1e-6"])
    with pytest.raises(ConfigError, match=r"optim\.b1: the lm recipe's optimizer adafactor does "
                                          r"not read it \(read by: adamw, lamb, lion\)"):
        parse_args(["--optim.b1", "0.95"])
    # Lion's own moments in every kind, not those of the kind's AdamW or LAMB
    for argv in ([], ner, ["--model.arch", "act"]):
        lion = parse_args(argv + ["--optim.name", "lion", "--optim.lr", "1e-4"]).optim
        assert (lion.b1, lion.b2, lion.eps) == (0.9, 0.99, None), argv
