"""The warmup-stable-decay schedule (jaxdepth/optim.py) against hand-computed rates,
and that the command line and --help know it from the registry alone."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.config.cli import parse_args
from jaxdepth.config.help import help_text
from jaxdepth.config import OptimConfig
from jaxdepth.optim import schedule


def lr_at(cfg, total, steps, lr=None):
    f = schedule(cfg, total, lr)
    py = np.array([float(f(s)) for s in steps])  # Python ints, as the training loop logs them
    arr = np.asarray(jax.vmap(f)(jnp.asarray(steps, jnp.int32)))  # int32, as optax's step count
    np.testing.assert_allclose(arr, py, rtol=1e-6, atol=1e-9)
    return py


def test_wsd_hand_values():
    # lr 0.1, 10 warmup steps, 110 in all: the last 22 (20% of 110) decay to 0.1 * 0.1 = 0.01,
    # so the rate holds 0.1 from step 10 to step 88
    cfg = OptimConfig(schedule="wsd", lr=0.1, warmup_steps=10, min_lr_ratio=0.1)
    steps = [0, 5, 10, 50, 88, 99, 109, 110, 500]
    hand = [0.0, 0.05, 0.1, 0.1, 0.1, 0.1 - 0.09 * 11 / 22, 0.1 - 0.09 * 21 / 22, 0.01, 0.01]
    np.testing.assert_allclose(lr_at(cfg, 110, steps), hand, rtol=1e-6, atol=1e-9)


def test_wsd_without_warmup_and_with_a_traced_rate():
    # 100 steps, no warmup, to 0: constant 1.0 up to step 80, then 1 - (s - 80) / 20
    cfg = OptimConfig(schedule="wsd", lr=1.0, warmup_steps=0, min_lr_ratio=0.0)
    steps = [0, 79, 80, 85, 95, 100]
    hand = [1.0, 1.0, 1.0, 0.75, 0.25, 0.0]
    np.testing.assert_allclose(lr_at(cfg, 100, steps), hand, rtol=1e-6, atol=1e-9)
    # a trial's rate arrives traced (trainer/trials.py): the same shape, scaled
    traced = jax.jit(lambda lr: jax.vmap(schedule(cfg, 100, lr))(jnp.asarray(steps)))
    np.testing.assert_allclose(np.asarray(traced(jnp.float32(0.5))), np.array(hand) * 0.5,
                               rtol=1e-6, atol=1e-9)


def test_a_run_shorter_than_its_warmup_still_decays_in_one_step():
    cfg = OptimConfig(schedule="wsd", lr=1.0, warmup_steps=10, min_lr_ratio=0.5)
    np.testing.assert_allclose(lr_at(cfg, 5, [0, 5, 10, 11, 20]), [0.0, 0.5, 1.0, 0.5, 0.5],
                               rtol=1e-6, atol=1e-9)


def test_the_command_line_and_help_know_it():
    cfg = parse_args(["--optim.schedule", "wsd"])
    assert cfg.optim.schedule == "wsd"
    line = next(i for i, l in enumerate(help_text().splitlines()) if "--optim.schedule" in l)
    assert "wsd" in " ".join(help_text().splitlines()[line:line + 4])


def test_its_decay_fraction_is_a_setting_it_alone_reads():
    """optim.decay_fraction is read by WSD alone (its READS): it sets the cooldown, is
    checked by WSD, and is refused for another schedule, --help naming its reader."""
    import pytest

    from jaxdepth.config import ConfigError
    # half of 100 steps cooling down from 1.0 to 0: step 75 is halfway
    cfg = OptimConfig(schedule="wsd", lr=1.0, warmup_steps=0, min_lr_ratio=0.0,
                      decay_fraction=0.5)
    np.testing.assert_allclose(lr_at(cfg, 100, [0, 50, 75, 100]), [1.0, 1.0, 0.5, 0.0],
                               rtol=1e-6, atol=1e-9)
    assert parse_args(["--optim.schedule", "wsd", "--optim.decay_fraction", "0.5"]
                      ).optim.decay_fraction == 0.5
    with pytest.raises(ConfigError, match=r"^optim\.decay_fraction: must be in \(0, 1\], got 1\.5"):
        parse_args(["--optim.schedule", "wsd", "--optim.decay_fraction", "1.5"])
    with pytest.raises(ConfigError, match=r"^optim\.decay_fraction: optim\.schedule cosine does "
                                          r"not read it \(read by: wsd\)"):
        parse_args(["--optim.schedule", "cosine", "--optim.decay_fraction", "0.5"])
    with pytest.raises(ConfigError, match=r"optim\.schedule cosine does not read it"):
        parse_args(["--optim.decay_fraction", "0.5"])  # the lm recipe's schedule
    text = help_text()
    assert "--optim.decay_fraction" in text and "read by optim.schedule: wsd" in text
