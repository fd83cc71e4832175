"""Feature extraction on cached backbone states (tasks/state_cache.py): the same training and
the same evaluations as rerunning the frozen backbone every step."""

import numpy as np
import pytest

from test_ner_job import _ner_cfg, _read_jsonl, wikiann_dir  # noqa: F401 (fixture)

@pytest.fixture(scope="module")
def ner_dir(wikiann_dir):
    return wikiann_dir

def _run(run_dir, ner_dir, method, run=None, **fusion):
    from jaxdepth.tasks import train

    run_over = {"steps": 12, "eval_every": 4, "save_every": 6, "log_every": 1, **(run or {})}
    summary = train(_ner_cfg(run_dir, ner_dir, fusion={"method": method, "mode": "fe", **fusion},
                             run=run_over))
    losses = [r["loss"] for r in _read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]
    return summary, np.array(losses), _read_jsonl(run_dir / "evals.jsonl")

def _same_training(a, b):
    """Losses to 1e-6 (the backbone ran on other batch compositions, so a matmul may round
    differently; on x86 CPUs they come out bit-identical) and identical F1 at every point."""
    (_, loss_a, ev_a), (_, loss_b, ev_b) = a, b
    assert len(loss_a) == len(loss_b) == 12
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6, atol=1e-6)
    assert [r["step"] for r in ev_a] == [r["step"] for r in ev_b] == [4, 8, 12]
    for ra, rb in zip(ev_a, ev_b):
        for k in ("dev_f1", "test_f1", "dev_precision", "test_recall"):
            assert ra[k] == rb[k], (k, ra, rb)

@pytest.fixture(scope="module")
def uncached_dwatt(ner_dir, tmp_path_factory):
    return _run(tmp_path_factory.mktemp("plain") / "run", ner_dir, "dwatt", cache=False)

@pytest.mark.parametrize("method", ["dwatt", "base+n"])
def test_cached_fe_trains_and_scores_like_the_uncached(ner_dir, tmp_path, method, capsys,
                                                       uncached_dwatt):
    uncached = uncached_dwatt if method == "dwatt" else \
        _run(tmp_path / "plain", ner_dir, method, cache=False)
    cached = _run(tmp_path / "cached", ner_dir, method)
    assert "caching the frozen backbone's states of 60 sentences" in capsys.readouterr().out
    _same_training(uncached, cached)
    assert cached[0]["best_dev_f1"] == uncached[0]["best_dev_f1"]
    assert not (tmp_path / "cached" / "cache").exists()  # small: held in memory
    # the cached step never runs the backbone, and is counted so
    assert 0 < cached[0]["flops_per_token"] < uncached[0]["flops_per_token"]

def test_memory_mapped_cache_and_resume(ner_dir, tmp_path, capsys, uncached_dwatt):
    """Over fusion.cache_mib (0: always) the states go to <run>/cache/*.npy; a run interrupted at step 6
    and resumed (the cache recomputed) matches an uninterrupted uncached one."""
    run = tmp_path / "mm"
    _run(run, ner_dir, "dwatt", cache_mib=0, run={"stop_after": 6})
    assert "memory-mapped under" in capsys.readouterr().out
    files = sorted(p.name for p in (run / "cache").iterdir())
    assert files == ["dev.process0.npy", "test.process0.npy", "train.process0.npy"]
    rows = np.load(run / "cache" / "train.process0.npy", mmap_mode="r")
    assert rows.shape[0] == 40 and rows.dtype == np.float32
    resumed = _run(run, ner_dir, "dwatt", cache_mib=0)
    _same_training(uncached_dwatt, resumed)

def test_a_cache_read_before_the_model_is_ready_is_an_error():
    from jaxdepth.tasks.state_cache import StateCache

    cache = StateCache(3)
    assert len(cache) == 3
    with pytest.raises(RuntimeError, match="before the model was ready"):
        cache[np.array([0, 2])]
