"""bench_packed_attention.py: its banded attention is the model's `attend` exactly when the band
covers every example, and not when an example is longer (so the saving it reports is real)."""
import sys
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_packed_attention as bench  # noqa: E402

B, T, N, H, BLOCK = 2, 64, 2, 8, 8


def inputs(seg):
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    q, k, v = (jax.random.normal(keys[i], (B, T, N, H)) for i in range(3))
    return q, k, v, jax.random.normal(keys[3], (N, T, T)), seg


def test_band_equals_full_attention_when_it_covers_every_example():
    seg = bench.packed_rows(B, T, np.arange(3, 2 * BLOCK + 2), seed=0)  # longest 2 * 8 + 1
    assert max(np.unique(r[r > 0], return_counts=True)[1].max() for r in seg) > BLOCK + 1
    args = inputs(seg)
    full = np.asarray(bench.full_attention(*args))
    band = np.asarray(bench.banded_attention(*args, block=BLOCK, back=2))
    np.testing.assert_allclose(band, full, rtol=1e-5, atol=1e-6)


def test_band_narrower_than_an_example_differs():
    seg = np.ones((B, T), np.int32)  # one 64-token example per row
    args = inputs(seg)
    full = np.asarray(bench.full_attention(*args))
    band = np.asarray(bench.banded_attention(*args, block=BLOCK, back=2))
    # the first 3 blocks see every earlier token either way; later queries lose keys
    np.testing.assert_allclose(band[:, :3 * BLOCK], full[:, :3 * BLOCK], rtol=1e-5, atol=1e-6)
    assert np.abs(band[:, 3 * BLOCK:] - full[:, 3 * BLOCK:]).max() > 1e-2


def test_band_is_exact_at_real_positions_behind_a_long_padding_tail():
    seg = np.zeros((B, T), np.int32)
    seg[:, :10], seg[:, 10:20] = 1, 2  # then 44 padding positions, longer than the band
    args = inputs(seg)
    full = np.asarray(bench.full_attention(*args))
    band = np.asarray(bench.banded_attention(*args, block=BLOCK, back=2))
    np.testing.assert_allclose(band[:, :20], full[:, :20], rtol=1e-5, atol=1e-6)
    assert np.abs(band[:, 20:] - full[:, 20:]).max() > 1e-3  # padding sees a shorter band
