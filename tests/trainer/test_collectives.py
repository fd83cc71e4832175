"""The cross-device traffic of the step the trainer builds (trainer/state.start), read from the
compiled program on the suite's 8 CPU devices: 8 trials over data = 8 hold no collective at
all (each device trains its own trial), and one trial's rows over data = 8 in 4 micro-batches
reduce their gradients once, after the accumulation loop, not once per micro-batch; the update
is the one-device update up to rounding; with dropout the reduction stays per micro-batch,
whose masks are then those of one device (AdamW with eps 1 here, so that the update is about
linear in the gradient: the first step of Adafactor or Adam divides each gradient by its own
size, which makes a rounding difference in a gradient near zero a difference of the update's
size, between one device and eight with or without accumulation alike)."""
import re

import equinox as eqx
import jax
import numpy as np
import pytest

from jaxdepth.config.cli import parse_args
from jaxdepth.tasks import task_for
from jaxdepth.trainer.sharding import batch_sharding, make_mesh
from jaxdepth.trainer.state import start
from jaxdepth.config.trials import trial_configs

pytestmark = pytest.mark.fake_devices
B, T = 32, 16
COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)"
                        r"(?:-start)?\(")


def _step(k: int, accum: int, data: int, dropout: float = 0.0):
    args = ["--preset", "tiny-L1", "--data.batch_size", str(B), "--data.seq_len", str(T),
            "--optim.accum_steps", str(accum), "--mesh.data", str(data),
            "--optim.warmup_steps", "0", "--optim.name", "adamw", "--optim.lr", "1e-2",
            "--optim.eps", "1.0", "--model.dropout", str(dropout)]
    if k > 1:
        args += ["--run.seeds", ",".join(map(str, range(k)))]
    cfgs = trial_configs(parse_args(args))
    mesh = make_mesh(cfgs[0].mesh)
    state, run, _ = start(cfgs, [task_for(c) for c in cfgs], mesh)
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, cfgs[0].model.vocab_size, (k, B, T + 1)).astype(np.int32)
    arrays = {"inputs": tokens[..., :-1], "targets": tokens[..., 1:],
              "weights": np.ones((k, B, T), np.float32),
              "segment_ids": np.ones((k, B, T), np.int32)}
    batch = {n: jax.device_put(a, batch_sharding(mesh, k)) for n, a in arrays.items()}
    return state, run, batch


def _collectives(run, state, batch) -> tuple[list[str], list[str]]:
    """(collectives inside a while loop's body, collectives elsewhere) of the compiled step."""
    compiled = run.lower(state, batch).compile()
    text = getattr(compiled, "compiled", compiled).as_text()  # equinox's wraps jax's
    bodies = set(re.findall(r"body=(%[\w.\-]+)", text))
    inside, outside, current = [], [], None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?(%[\w.\-]+) .*\{$", line.rstrip())
        if head:
            current = head.group(1)
            continue
        for op in COLLECTIVE.findall(line):
            (inside if current in bodies else outside).append(op)
    return inside, outside


def test_trials_over_the_data_axis_hold_no_collective():
    state, run, batch = _step(8, 1, 8)
    assert _collectives(run, state, batch) == ([], [])


def test_accumulated_gradients_are_reduced_once_after_the_loop():
    state, run, batch = _step(1, 4, 8)
    inside, outside = _collectives(run, state, batch)
    assert inside == [] and "all-reduce" in outside, (inside, outside)
    new, m = run(state, batch)
    one, run1, batch1 = _step(1, 4, 1)
    new1, m1 = run1(one, batch1)
    for name in ("loss", "grad_norm"):
        np.testing.assert_allclose(np.asarray(m[name]), np.asarray(m1[name]), rtol=2e-6)
    for a, b in zip(jax.tree.leaves(eqx.filter(new.model, eqx.is_array)),
                    jax.tree.leaves(eqx.filter(new1.model, eqx.is_array))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_with_dropout_the_masks_do_not_depend_on_the_mesh():
    """Groups of a device's rows would draw their own masks: a model with dropout keeps one
    reduction per micro-batch, and its loss is one device's (the groups' gave 6.7742 against
    6.7630 here)."""
    state, run, batch = _step(1, 4, 8, dropout=0.1)
    inside, _ = _collectives(run, state, batch)
    assert "all-reduce" in inside, inside
    _, m = run(state, batch)
    one, run1, batch1 = _step(1, 4, 1, dropout=0.1)
    _, m1 = run1(one, batch1)
    np.testing.assert_allclose(np.asarray(m["loss"]), np.asarray(m1["loss"]), rtol=2e-6)

