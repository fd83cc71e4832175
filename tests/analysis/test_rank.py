"""Effective rank of the feed-forward matrices: the formula, the model table, files, the CLI."""
import csv
import json
import math

import jax
import numpy as np
import pytest

from jaxdepth.analysis import rank
from jaxdepth.experiments import run_rank
from jaxdepth.config import Config, ModelConfig
from jaxdepth.models.decoder import DecoderLM


def _orthogonal(rng, n):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return q


def test_identity_has_full_effective_rank():
    for n in (1, 5, 17):
        assert abs(rank.effective_rank(np.eye(n)) - n) < 1e-9


def test_rank_one_matrix_has_effective_rank_one():
    rng = np.random.default_rng(0)
    m = np.outer(rng.standard_normal(7), rng.standard_normal(4))
    assert rank.effective_rank(m) == pytest.approx(1.0, abs=1e-9)


def test_known_spectrum_by_hand():
    rng = np.random.default_rng(1)
    s = np.array([3.0, 2.0, 1.0, 0.0, 0.0, 0.0])
    u, v = _orthogonal(rng, 6), _orthogonal(rng, 6)
    m = u @ np.diag(s) @ v.T
    p = [3 / 6, 2 / 6, 1 / 6]  # the zeros contribute 0 log 0 = 0
    expected = math.exp(-sum(x * math.log(x) for x in p))
    assert rank.effective_rank(m) == pytest.approx(expected, rel=1e-9)
    np.testing.assert_allclose(rank.normalized_spectrum(m), [0.5, 1 / 3, 1 / 6, 0, 0, 0],
                               atol=1e-12)


def test_cumulative_is_monotone_and_ends_at_one():
    m = np.random.default_rng(2).standard_normal((9, 5))
    c = rank.cumulative_spectrum(m)
    assert c.shape == (5,)
    assert np.all(np.diff(c) >= 0)
    assert c[-1] == pytest.approx(1.0, abs=1e-12)


def test_zero_matrix_has_rank_zero():
    assert rank.effective_rank(np.zeros((3, 4))) == 0.0


@pytest.fixture(scope="module")
def tiny_model():
    # Module-scoped: building a model costs seconds of tracing, the tests only read it.
    return DecoderLM(ModelConfig(vocab_size=32, d_model=16, n_layers=3, d_ff=24),
                     key=jax.random.key(0))


def test_ff_rank_table_matches_weights(tiny_model):
    rows = rank.ff_rank_table(tiny_model)
    assert len(rows) == 9
    assert [(r["layer"], r["matrix"]) for r in rows] == [
        (l, m) for l in range(3) for m in ("wi_0", "wi_1", "wo")]
    mlp = tiny_model.blocks.mlp
    stacked = {"wi_0": np.asarray(mlp.wi_0), "wi_1": np.asarray(mlp.wi_1), "wo": np.asarray(mlp.wo)}
    for r in rows:
        w = stacked[r["matrix"]][r["layer"]]
        assert r["shape"] == list(w.shape)
        assert r["shape"] == ([24, 16] if r["matrix"] == "wo" else [16, 24])
        assert r["max_rank"] == 16
        assert r["erank"] == pytest.approx(rank.effective_rank(w), rel=1e-12)
        assert r["erank_ratio"] == pytest.approx(r["erank"] / 16)
        assert 1.0 < r["erank"] <= 16.0
        assert len(r["cumulative"]) == 16 and r["cumulative"][-1] == pytest.approx(1.0)


def test_write_rank_outputs(tiny_model, tmp_path):
    rows = rank.ff_rank_table(tiny_model)
    paths = rank.write_rank_outputs(rows, tmp_path / "out", label="tiny")
    assert {p.name for p in paths.values()} == {"ff_rank.csv", "ff_rank.json", "ff_rank.png"}
    assert all(p.stat().st_size > 0 for p in paths.values())
    with paths["csv"].open() as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows)
    for g, r in zip(got, rows):
        assert int(g["layer"]) == r["layer"] and g["matrix"] == r["matrix"]
        assert [int(g["rows"]), int(g["cols"])] == r["shape"]
        assert float(g["erank"]) == pytest.approx(r["erank"], rel=1e-12)
        assert int(g["max_rank"]) == r["max_rank"]
        assert float(g["erank_ratio"]) == pytest.approx(r["erank_ratio"], rel=1e-12)
        assert "cumulative" not in g
    saved = json.loads(paths["json"].read_text())
    assert saved["label"] == "tiny"
    assert saved["rows"][4]["cumulative"] == pytest.approx(rows[4]["cumulative"])


def test_rank_by_depth(tiny_model, getkey, tmp_path):
    shallow = DecoderLM(ModelConfig(vocab_size=32, d_model=16, n_layers=1, d_ff=40), key=getkey())
    models = {3: tiny_model, 1: shallow}
    rows = [{"depth": d, **row} for d in sorted(models) for row in rank.ff_rank_table(models[d])]
    assert len(rows) == 3 * 4 and [r["depth"] for r in rows[:3]] == [1, 1, 1]
    assert rows[0]["shape"] == [16, 40]
    points = rank.rank_vs_depth(rows)
    sel = [r["erank_ratio"] for r in rows if r["depth"] == 3 and r["matrix"] == "wo"]
    assert len(sel) == 3
    got = next(p for p in points if p["depth"] == 3 and p["matrix"] == "wo")
    assert got["mean_erank_ratio"] == pytest.approx(np.mean(sel))
    paths = rank.write_rank_vs_depth(rows, tmp_path)
    with paths["csv"].open() as f:
        assert len(list(csv.DictReader(f))) == 6
    assert paths["png"].stat().st_size > 0


def _save_checkpoint(run_dir, steps):
    """A run directory with checkpoints at the given steps, without training anything."""
    from jaxdepth.data.corpus.pipeline import lm_dataset, lm_iterator
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer import checkpoint as ckpt
    from jaxdepth.optim import make_optimizer
    from jaxdepth.trainer.state import init_one
    from jaxdepth.trainer.trials import Batches
    from jaxdepth.models.trial_axis import stack

    cfg = Config.from_dict({"model": {"vocab_size": 32, "d_model": 16, "n_layers": 2, "d_ff": 24},
                            "data": {"seq_len": 8, "batch_size": 2},
                            "run": {"dir": "runs/rank-test", "steps": 10}})
    state = stack([init_one(cfg, make_optimizer(cfg.optim, cfg.run.steps), task_for(cfg))])
    tokens = np.random.default_rng(0).integers(0, 32, size=200).astype(np.int32)
    it = Batches([lm_iterator(lm_dataset(tokens, seq_len=8, global_batch=2, seed=0),
                              prefetch=0)])
    mngr = ckpt.open_manager(run_dir)
    for s in steps:
        ckpt.save(mngr, s, state, it.states(), cfg)
    mngr.wait_until_finished()
    mngr.close()
    return state, cfg


def test_load_model_and_cli(tmp_path, capsys):
    from jaxdepth.tasks import load_model

    run = tmp_path / "run"
    state, cfg = _save_checkpoint(run, steps=(3, 5))

    model, got_cfg, step = load_model(run)
    assert step == 5 and got_cfg == cfg
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(state.models().one(0))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert load_model(run, step=3)[2] == 3
    with pytest.raises(ValueError, match=r"available: \[3, 5\]"):
        load_model(run, step=4)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoints"):
        load_model(tmp_path / "empty")

    out = tmp_path / "rank_out"
    assert run_rank.main(["--run", str(run), "--out", str(out)]) == 0
    with (out / "ff_rank.csv").open() as f:
        got = list(csv.DictReader(f))
    expected = rank.ff_rank_table(state.models().one(0))
    assert len(got) == 6
    for g, r in zip(got, expected):
        assert float(g["erank"]) == pytest.approx(r["erank"], rel=1e-12)
    assert run_rank.main(["--run", str(run), "--step", "4"]) == 2
    assert "available" in capsys.readouterr().err
