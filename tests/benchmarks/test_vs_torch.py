"""The PyTorch reference model of benchmarks/bench_vs_torch.py: same loss, gradients and AdamW
step as jaxdepth for identical weights.

This file runs only in a process of its own, which test_benchmarks.py starts (conftest.py
ignores it otherwise): importing torch loads its native libraries and thread pool into the
process for good, and the JAX test workers live for the whole suite."""
import sys
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_vs_torch  # noqa: E402

from jaxdepth.config import ModelConfig  # noqa: E402
from jaxdepth.models.layers import relative_position_bucket  # noqa: E402
from jaxdepth.models.decoder import DecoderLM  # noqa: E402
from jaxdepth.tasks.losses import lm_loss_sums  # noqa: E402


def _torch():
    return pytest.importorskip("torch")


SMALL = ModelConfig(vocab_size=97, d_model=64, n_layers=2, d_ff=96, n_heads=4)


def _batch(m: ModelConfig, B: int, T: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, m.vocab_size, size=(B, T + 1), dtype=np.int32)
    w = (rng.random((B, T)) < 0.8).astype(np.float32)
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "weights": w}


def test_torch_buckets_match():
    t = _torch()
    rel = np.arange(-1000, 1001)
    ours = np.asarray(relative_position_bucket(jnp.asarray(rel), 32, 128))
    ref = bench_vs_torch.t5_bucket(t.from_numpy(rel), 32, 128).numpy()
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("attn", ["sdpa", "math"])
def test_torch_reference_same_loss_and_grads(getkey, attn):
    t = _torch()
    T = 150  # past max_distance 128, so every bucket kind is exercised
    model = DecoderLM(SMALL, key=getkey())
    b = _batch(SMALL, 2, T)
    jb = {k: jnp.asarray(v) for k, v in b.items()}

    def loss(mdl):
        _, nll, n = lm_loss_sums(mdl(jb["inputs"]), jb["targets"], jb["weights"])
        return nll / n

    j_loss, j_grads = eqx.filter_value_and_grad(loss)(model)
    tm = bench_vs_torch.TorchDecoderLM(SMALL, attn).load_jax(model)
    inp, tgt = t.from_numpy(b["inputs"]).long(), t.from_numpy(b["targets"]).long()
    t_loss = bench_vs_torch.torch_loss(tm, inp, tgt, t.from_numpy(b["weights"]))
    t_loss.backward()
    assert abs(float(j_loss) - float(t_loss.detach())) < 1e-4
    np.testing.assert_allclose(tm(inp).detach().numpy(), np.asarray(model(jb["inputs"])),
                               atol=1e-4, rtol=1e-4)
    pairs = [(j_grads.embed, tm.embed), (j_grads.lm_head, tm.lm_head),
             (j_grads.rel_bias.table, tm.rel_table), (j_grads.final_norm.scale, tm.final_norm)]
    jbk = j_grads.blocks
    for i, blk in enumerate(tm.blocks):
        pairs += [(jbk.attn.wq[i], blk.wq), (jbk.attn.wk[i], blk.wk), (jbk.attn.wv[i], blk.wv),
                  (jbk.attn.wo[i], blk.wo), (jbk.mlp.wi_0[i], blk.wi_0),
                  (jbk.mlp.wi_1[i], blk.wi_1), (jbk.mlp.wo[i], blk.wo_ff),
                  (jbk.attn_norm.scale[i], blk.attn_norm), (jbk.mlp_norm.scale[i], blk.mlp_norm)]
    for g_j, p_t in pairs:
        np.testing.assert_allclose(p_t.grad.numpy(), np.asarray(g_j), atol=2e-5, rtol=1e-3)


def test_torch_train_step_matches_jax():
    """Two AdamW steps (clipping, no decay on norms) on each side, from the same weights."""
    _torch()
    cfg = bench_vs_torch.bench_config(SMALL, seq_len=24, batch=4)
    batch = _batch(SMALL, 4, 24, seed=1)
    jx = bench_vs_torch.JaxSide(cfg, batch)
    ts = bench_vs_torch.TorchSide(cfg, batch, jx.initial_model, compiled=False,
                                  attn_impl="sdpa", device="cpu")
    for _ in range(3):  # the third loss sees the weights after two updates
        lj, lt = jx.step(), ts.step()
        assert abs(lj - lt) < 1e-4, (lj, lt)


def test_alone_times_each_contestant_in_a_process_of_its_own(tmp_path):
    """--alone: one child process per contestant and round (--only), the ratio that of the
    medians of every step the children timed."""
    _torch()
    out = bench_vs_torch.main(["--alone", "--alone-rounds", "2", "--no-compile", "--preset",
                               "tiny-L2", "--seq-len", "16", "--batch", "2", "--warmup", "1",
                               "--rounds", "2", "--out", str(tmp_path / "alone.json")])
    assert [(r["round"], r["contestant"]) for r in out["runs"]] == [
        (0, "jax"), (0, "torch_eager"), (1, "jax"), (1, "torch_eager")]
    assert {k: len(v) for k, v in out["step_s_all"].items()} == {"jax": 4, "torch_eager": 4}
    med = {k: float(np.median(v)) for k, v in out["step_s_all"].items()}
    assert out["jax_over_torch_eager"] == pytest.approx(med["torch_eager"] / med["jax"])
