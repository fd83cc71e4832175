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
    and resumed (the cache reused in this process, recomputed in a new one) matches an
    uninterrupted uncached one."""
    from jaxdepth.tasks import state_cache

    state_cache._REUSED.clear()  # else the states an earlier test held in memory are reused
    run = tmp_path / "mm"
    _run(run, ner_dir, "dwatt", cache_mib=0, run={"stop_after": 6})
    assert "memory-mapped under" in capsys.readouterr().out
    files = sorted(p.name for p in (run / "cache").iterdir())
    assert files == ["dev.process0.npy", "test.process0.npy", "train.process0.npy"]
    from jaxdepth.tasks.ner import NERTask

    task = NERTask(_ner_cfg(run, ner_dir, fusion={"method": "dwatt", "mode": "fe"}))
    data = task.prepare(run, primary=False, barrier=lambda: None)
    words = int((data.arrays["train"]["positions"] > 0).sum())  # the 40 sentences' words
    rows = np.load(run / "cache" / "train.process0.npy", mmap_mode="r")
    assert rows.shape[0] == words > 40 and rows.ndim == 3 and rows.dtype == np.float32
    resumed = _run(run, ner_dir, "dwatt", cache_mib=0)
    _same_training(uncached_dwatt, resumed)

def test_a_cache_read_before_the_model_is_ready_is_an_error():
    from jaxdepth.tasks.state_cache import StateCache

    cache = StateCache(3)
    assert len(cache) == 3
    with pytest.raises(RuntimeError, match="before the model was ready"):
        cache[np.array([0, 2])]


# --- the pieces, on a small random backbone -------------------------------------------------

def _small_model(method):
    import jax

    from jaxdepth.models.specs import EncoderConfig
    from jaxdepth.models.encoder import Encoder
    from jaxdepth.models.fused import FusedModel

    enc = EncoderConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=2, d_ff=64,
                        max_positions=64, dropout=0.1)
    return FusedModel(Encoder(enc, key=jax.random.key(1)), method=method, frozen_backbone=True,
                      n_labels=5, key=jax.random.key(2))


def _sentences(n=11, T=64, P=12, seed=0):
    """Sentences of 3..60 pieces; each labels its first pieces' word slots."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 61, n)
    lengths[0] = 60  # one long sentence, as a real split has
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
    tokens = np.where(mask, rng.integers(5, 50, (n, T)), 0).astype(np.int32)
    positions = np.zeros((n, P), np.int32)
    for i, length in enumerate(lengths):
        w = int(rng.integers(0, min(P, length - 2) + 1))
        positions[i, :w] = np.sort(rng.choice(np.arange(1, length - 1), w, replace=False))
    return {"tokens": tokens, "segments": np.zeros_like(tokens), "mask": mask,
            "positions": positions}


def _filled(method, arrays, by_length, batch=4):

    from jaxdepth.tasks import state_cache as sc

    model = _small_model(method)
    spec = sc.row_spec(model, arrays)
    cache = sc.StateCache(len(arrays["tokens"])) if method == "base+n" else \
        sc.WordCache(arrays["positions"])
    sc.fill(cache, model, arrays, batch, spec, None, by_length)
    return cache, model, spec


@pytest.mark.parametrize("method", ["dwatt", "base+n"])
def test_states_filled_by_length_equal_full_width_ones(method):
    """Batches cut to their width give the full-width states to float rounding (1e-5) at
    every position a sentence has, and zeros past the width for Base+n's rows."""
    arrays = _sentences()
    full, _, _ = _filled(method, arrays, by_length=False)
    cut, _, _ = _filled(method, arrays, by_length=True)
    if method == "base+n":
        real = arrays["mask"].astype(bool)
        np.testing.assert_allclose(cut.array[real], full.array[real], rtol=1e-5, atol=1e-5)
    else:
        assert cut.array.shape == full.array.shape == (int((arrays["positions"] > 0).sum()), 3, 32)
        np.testing.assert_allclose(cut.array, full.array, rtol=1e-5, atol=1e-5)


def test_word_cache_holds_each_words_states_in_slot_order():
    import equinox as eqx

    arrays = _sentences()
    cache, model, _ = _filled("dwatt", arrays, by_length=False)
    states = np.asarray(eqx.filter_jit(lambda m: m.frozen_states(
        arrays["tokens"], arrays["segments"], arrays["mask"], arrays["positions"]))(model))
    for r in range(len(arrays["tokens"])):
        lo, hi = cache.offsets[r], cache.offsets[r + 1]
        slots = np.nonzero(arrays["positions"][r] > 0)[0]
        assert list(cache.slot[lo:hi]) == list(slots)
        np.testing.assert_allclose(cache.array[lo:hi], np.moveaxis(states[r][:, slots], 1, 0),
                                   rtol=1e-6, atol=1e-6)


def test_packed_batches_split_into_the_trainers_micro_batches():
    """Two processes × 2 micro-batches: after the global concatenation and the train step's
    split (row b -> micro-batch b % accum), micro-batch m holds the words of its rows in row
    order, with slots into its own [rows, P] grid, then zero padding."""
    from jaxdepth.tasks.state_cache import WordCache

    P, accum, procs, batch = 5, 2, 2, 8
    rng = np.random.default_rng(1)
    counts = rng.integers(0, P + 1, 9)
    positions = (np.arange(P)[None] < counts[:, None]).astype(np.int32)
    cache = WordCache(positions)
    cache.array = np.arange(1, int(counts.sum()) + 1, dtype=np.float32)[:, None, None] * \
        np.ones((1, 2, 3), np.float32)  # word w's states are all w + 1
    rows = rng.integers(0, 9, batch)  # the global batch's sentences
    micro_rows, per_micro = batch // accum, 24  # per process: 12 >= 2 rows of <= 5 words
    parts = [cache.pack(rows[p * 4:(p + 1) * 4], first_row=p * 4, accum=accum,
                        micro_rows=micro_rows, per_micro=per_micro // procs)
             for p in range(procs)]
    words = np.concatenate([w for w, _ in parts])
    slots = np.concatenate([s for _, s in parts])
    split = lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
    for m in range(accum):
        got_w, got_s = split(words)[m][:, 0, 0], split(slots)[m]
        want_w, want_s = [], []
        for p in range(procs):
            for b in range(p * 4, (p + 1) * 4):
                if b % accum != m:
                    continue
                r = rows[b]
                lo, hi = cache.offsets[r], cache.offsets[r + 1]
                want_w += list(range(lo + 1, hi + 1))
                want_s += [(b // accum) * P + s for s in range(hi - lo)]
            pad = (per_micro // procs) * (p + 1) - len(want_w)
            want_w += [0] * pad
            want_s += [micro_rows * P] * pad
        assert list(got_w) == want_w and list(got_s) == want_s, m
    with pytest.raises(ValueError, match="more than its bound of 1 word slots"):
        cache.pack(np.array([int(np.argmax(counts))]), first_row=0, accum=1, micro_rows=1,
                   per_micro=1)


def test_scored_splits_are_reused_within_a_process_and_only_for_the_same_backbone():
    import equinox as eqx
    import jax.numpy as jnp

    from jaxdepth.tasks import state_cache as sc

    arrays = _sentences()
    model = _small_model("dwatt")
    spec = sc.row_spec(model, arrays)
    digest = sc.backbone_digest(model)
    first, again = sc.WordCache(arrays["positions"]), sc.WordCache(arrays["positions"])
    sc._REUSED.clear()
    assert not sc.fill_or_reuse(first, model, arrays, 4, spec, True, digest)
    assert sc.fill_or_reuse(again, model, arrays, 4, spec, True, digest)
    assert again.array is first.array and not again.array.flags.writeable
    # other weights, another split, or other batching: computed afresh
    moved = eqx.tree_at(lambda m: m.backbone.embed.word_VD, model,
                        model.backbone.embed.word_VD + jnp.float32(1e-3))
    assert sc.backbone_digest(moved) != digest
    other = sc.WordCache(arrays["positions"])
    assert not sc.fill_or_reuse(other, moved, arrays, 4, spec, True, sc.backbone_digest(moved))
    assert not np.allclose(other.array, first.array)
    fewer = {k: v[1:] for k, v in arrays.items()}
    assert not sc.fill_or_reuse(sc.WordCache(fewer["positions"]), model, fewer, 4, spec, True,
                                digest)
    assert not sc.fill_or_reuse(sc.WordCache(arrays["positions"]), model, arrays, 4, spec,
                                False, digest)
    assert not sc.fill_or_reuse(sc.WordCache(arrays["positions"]), model, arrays, 2, spec,
                                True, digest)  # other batches: other widths
    # Base+n reads other states from the same backbone
    assert sc.backbone_digest(_small_model("base+n")) != digest
    sc._REUSED.clear()


def test_a_reused_file_is_never_rewritten_under_its_readers(tmp_path):
    """States memory-mapped from a file are shared (trials, units); a later fill of the same
    path with other states drops the old entry first, so the old key computes afresh instead
    of reading the new states."""
    from jaxdepth.tasks import state_cache as sc

    arrays, other = _sentences(seed=0), _sentences(seed=1)
    model = _small_model("dwatt")
    spec, digest = sc.row_spec(model, arrays), sc.backbone_digest(model)
    path = tmp_path / "dev.process0.npy"
    sc._REUSED.clear()
    first = sc.WordCache(arrays["positions"])
    assert not sc.fill_or_reuse(first, model, arrays, 4, spec, True, digest, path)
    kept = np.array(first.array)
    shared = sc.WordCache(arrays["positions"])
    assert sc.fill_or_reuse(shared, model, arrays, 4, spec, True, digest, tmp_path / "unused.npy")
    assert shared.array is first.array and not (tmp_path / "unused.npy").exists()
    # the same path, other sentences: the file is rewritten and the first key forgotten
    assert not sc.fill_or_reuse(sc.WordCache(other["positions"]), model, other, 4, spec, True,
                                digest, path)
    again = sc.WordCache(arrays["positions"])
    assert not sc.fill_or_reuse(again, model, arrays, 4, spec, True, digest, tmp_path / "b.npy")
    np.testing.assert_array_equal(np.asarray(again.array), kept)
    sc._REUSED.clear()


def test_drawn_bounds_are_the_largest_micro_batch_and_process_share_drawn():
    from jaxdepth.data.corpus.pipeline import ExampleBatchSource
    from jaxdepth.tasks.ner import drawn_active_bounds, train_active_bound

    rng = np.random.default_rng(0)
    for n, batch, accum, procs in ((40, 8, 1, 1), (13, 8, 2, 1), (7, 16, 2, 2), (30, 12, 3, 2)):
        slots = rng.integers(0, 12, n)
        steps = 50
        whole, part = drawn_active_bounds(slots, seed=5, steps=steps, batch=batch, accum=accum,
                                          processes=procs)
        src = ExampleBatchSource({"s": slots}, global_batch=batch, seed=5)
        want_whole = want_part = 0
        for i in range(steps):
            s = src[i]["s"]
            for m in range(accum):
                want_whole = max(want_whole, int(s[m::accum].sum()))
                for p in range(procs):
                    local = np.arange(p * batch // procs, (p + 1) * batch // procs)
                    want_part = max(want_part, int(s[local[local % accum == m]].sum()))
        assert (whole, part) == (max(want_whole, 1), max(want_part, 1))
        assert whole <= train_active_bound(slots, batch // accum, batch)
