import numpy as np
import pytest

from jaxdepth.data.corpus.pipeline import (ExampleBatchSource, LMBatchSource, eval_batches,
                                           lm_dataset, lm_iterator, load_tokens, save_tokens,
                                           split_documents, tokenize_documents)

# With tokens = arange, window k is arange(k*T, k*T+T+1): its first input token names it.
T = 4
N_TOKENS = 103  # (103 - 1) // 4 = 25 windows; the last 2 tokens are never read
W = 25


def reference_windows(seed, i, global_batch, n_windows=W):
    """Window indices of global batch i, straight from the definition."""
    out = []
    for r in range(global_batch):
        s = i * global_batch + r
        perm = np.random.default_rng([seed, s // n_windows]).permutation(n_windows)
        out.append(perm[s % n_windows])
    return out


def window_ids(batch):
    return list(batch["inputs"][:, 0] // T)


def make(seed=7, global_batch=6, tokens=None, **kw):
    tokens = np.arange(N_TOKENS, dtype=np.int32) if tokens is None else tokens
    return lm_dataset(tokens, seq_len=T, global_batch=global_batch, seed=seed, **kw)


def test_batches_follow_the_definition():
    ds = make(seed=7, global_batch=6)
    for i in range(13):  # 78 samples: crosses two epoch boundaries, mid-batch
        batch = ds[i]
        ref = reference_windows(7, i, 6)
        expected = np.stack([np.arange(k * T, k * T + T + 1) for k in ref])
        assert batch["inputs"].dtype == np.int32 and batch["targets"].dtype == np.int32
        assert batch["weights"].dtype == np.float32
        np.testing.assert_array_equal(batch["inputs"], expected[:, :-1])
        np.testing.assert_array_equal(batch["targets"], expected[:, 1:])
        np.testing.assert_array_equal(batch["weights"], np.ones((6, T), np.float32))


def test_targets_are_inputs_shifted_by_one():
    tokens = np.random.default_rng(0).integers(0, 1000, size=N_TOKENS).astype(np.int32)
    source = LMBatchSource(tokens, seq_len=T, global_batch=6, seed=1)
    batch = source[3]
    for row, k in enumerate(source.rows(3)):
        np.testing.assert_array_equal(batch["inputs"][row], tokens[k * T : k * T + T])
        np.testing.assert_array_equal(batch["targets"][row], tokens[k * T + 1 : k * T + T + 1])


def test_same_seed_same_batches_other_seed_other_batches():
    a, b, c = make(seed=3), make(seed=3), make(seed=4)
    for i in (0, 1, 10, 2**40):
        for key in ("inputs", "targets", "weights"):
            np.testing.assert_array_equal(a[i][key], b[i][key])
    assert any(window_ids(a[i]) != window_ids(c[i]) for i in range(3))


def test_huge_step_index_is_exact():
    i = 2**61 + 5
    assert window_ids(make(seed=2)[i]) == reference_windows(2, i, 6)


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_partition_the_global_batch(process_count):
    full = make(seed=5, global_batch=8)
    parts = [
        make(seed=5, global_batch=8, process_index=p, process_count=process_count)
        for p in range(process_count)
    ]
    for i in range(7):  # batch 3 holds samples 24..31, across the first epoch boundary
        for key in ("inputs", "targets", "weights"):
            slices = [part[i][key] for part in parts]
            assert all(s.shape[0] == 8 // process_count for s in slices)
            np.testing.assert_array_equal(np.concatenate(slices), full[i][key])


def test_every_window_once_per_epoch():
    ds = make(seed=11, global_batch=6)
    samples = [k for i in range(25) for k in window_ids(ds[i])]  # 150 samples = 6 epochs
    epochs = [samples[e * W : (e + 1) * W] for e in range(6)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(W))
    assert len({tuple(epoch) for epoch in epochs}) == 6  # each epoch is reshuffled


def test_too_few_tokens():
    # 6 windows of 4 need 6 * 4 + 1 = 25 tokens.
    make(global_batch=6, tokens=np.arange(25, dtype=np.int32))
    with pytest.raises(ValueError, match="need at least 25 tokens"):
        make(global_batch=6, tokens=np.arange(24, dtype=np.int32))


def test_bad_process_split():
    with pytest.raises(ValueError, match="global_batch=6 is not divisible by process_count=4"):
        make(global_batch=6, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="bad process_index=2"):
        make(global_batch=6, process_index=2, process_count=2)


def assert_same_batch(x, y):
    for key in ("inputs", "targets", "weights"):
        np.testing.assert_array_equal(x[key], y[key])


def test_iterator_yields_the_dataset_in_order():
    ds = make(seed=9)
    it = lm_iterator(ds)
    for i in range(8):
        assert_same_batch(next(it), ds[i])


@pytest.mark.parametrize("prefetch", [0, 2])
def test_iterator_state_resumes_at_the_right_batch(prefetch):
    it = lm_iterator(make(seed=9), prefetch=prefetch)
    for _ in range(5):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]  # prefetching ahead must not leak into the state

    fresh = make(seed=9)
    restored = lm_iterator(fresh, prefetch=prefetch)
    next(restored)  # a used iterator is repositioned, not just a new one
    restored.set_state(state)
    started = lm_iterator(fresh, start=5, prefetch=prefetch)
    for i, batch in enumerate(expected):
        assert_same_batch(batch, fresh[5 + i])
        assert_same_batch(next(restored), fresh[5 + i])
        assert_same_batch(next(started), fresh[5 + i])


def test_iterator_state_through_orbax(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    import grain

    it = lm_iterator(make(seed=9))
    for _ in range(3):
        next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
        manager.wait_until_finished()
        fresh = make(seed=9)
        restored = lm_iterator(fresh)
        manager.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)))
    for i in range(3, 6):
        assert_same_batch(next(restored), fresh[i])


def test_save_and_memory_map_tokens(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 500, size=N_TOKENS).astype(np.int32)
    path = tmp_path / "train.tokens.npy"
    save_tokens(path, tokens)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tokens.npy"]
    mapped = load_tokens(path)
    assert isinstance(mapped, np.memmap)
    np.testing.assert_array_equal(mapped, tokens)
    for i in range(4):
        assert_same_batch(make(seed=2, tokens=mapped)[i], make(seed=2, tokens=tokens)[i])


def test_load_tokens_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.npy"):
        load_tokens(tmp_path / "absent.npy")
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"wrong\.npy: expected a 1-D int32"):
        load_tokens(wrong)
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(b"not numpy")
    with pytest.raises(ValueError, match=r"garbage\.npy is not a \.npy token file"):
        load_tokens(garbage)


def test_eval_batches_score_every_token_once():
    tokens = np.arange(1, 24, dtype=np.int32)  # 23 tokens, 22 targets; 0 marks padding
    batches = eval_batches(tokens, seq_len=4, batch_size=2)
    # 22 targets = 5 full windows + one of 2, in 3 batches of 2 rows.
    assert len(batches) == 3
    for b in batches:
        assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (2, 4)
    last = batches[-1]
    np.testing.assert_array_equal(last["inputs"], [[17, 18, 19, 20], [21, 22, 0, 0]])
    np.testing.assert_array_equal(last["targets"], [[18, 19, 20, 21], [22, 23, 0, 0]])
    np.testing.assert_array_equal(last["weights"], [[1, 1, 1, 1], [1, 1, 0, 0]])
    weights = np.concatenate([b["weights"] for b in batches])
    inputs = np.concatenate([b["inputs"] for b in batches])
    targets = np.concatenate([b["targets"] for b in batches])
    assert weights.sum() == 22
    np.testing.assert_array_equal(inputs[weights > 0], tokens[:-1])
    np.testing.assert_array_equal(targets[weights > 0], tokens[1:])
    assert not inputs[weights == 0].any() and not targets[weights == 0].any()


def test_eval_batches_pad_whole_rows():
    batches = eval_batches(np.arange(1, 10, dtype=np.int32), seq_len=4, batch_size=3)
    assert len(batches) == 1
    np.testing.assert_array_equal(batches[0]["targets"], [[2, 3, 4, 5], [6, 7, 8, 9], [0, 0, 0, 0]])
    np.testing.assert_array_equal(batches[0]["weights"].sum(axis=1), [4, 4, 0])


class CharTokenizer:
    """Ids are code points; enough to test how documents are joined."""

    def encode_batch(self, texts):
        return [[ord(c) for c in t] for t in texts]


def test_tokenize_documents_appends_eos():
    stream = tokenize_documents(["ab", "", "c"], CharTokenizer())
    assert stream.dtype == np.int32
    np.testing.assert_array_equal(stream, [97, 98, 1, 1, 99, 1])
    assert tokenize_documents([], CharTokenizer()).shape == (0,)


def test_split_documents():
    docs = [f"doc{i}" for i in range(100)]
    train, valid = split_documents(docs, 0.1, seed=0)
    assert len(valid) == 10 and len(train) == 90
    assert sorted(train + valid) == sorted(docs)
    assert train == [d for d in docs if d in set(train)]  # corpus order kept
    assert valid == [d for d in docs if d in set(valid)]
    assert split_documents(docs, 0.1, seed=0) == (train, valid)
    assert split_documents(docs, 0.1, seed=1)[1] != valid
    assert split_documents(docs, 0.0, seed=0) == (docs, [])


def test_split_documents_small_corpus():
    train, valid = split_documents(["a", "b"], 0.01, seed=3)
    assert len(valid) == 1 and len(train) == 1 and sorted(train + valid) == ["a", "b"]
    # round(0.5 * 1) = 1 would leave training empty.
    assert split_documents(["a"], 0.5, seed=3) == (["a"], [])
    with pytest.raises(ValueError, match="valid_fraction"):
        split_documents(["a", "b"], 1.0, seed=0)


def test_example_batches_follow_the_definition_and_split_over_processes():
    # 7 examples, batches of 4: batch 1 spans epochs 0 and 1; row k holds example k everywhere
    arrays = {"x": np.arange(7, dtype=np.int32)[:, None] * np.ones((1, 3), np.int32),
              "y": np.arange(7, dtype=np.int32)}
    full = ExampleBatchSource(arrays, global_batch=4, seed=3)
    for i in range(4):
        want = reference_windows(3, i, 4, n_windows=7)
        assert list(full[i]["y"]) == want and list(full[i]["x"][:, 2]) == want
    halves = [ExampleBatchSource(arrays, global_batch=4, seed=3, process_index=p, process_count=2)
              for p in range(2)]
    for i in range(3):
        np.testing.assert_array_equal(np.concatenate([h[i]["y"] for h in halves]), full[i]["y"])
    with pytest.raises(ValueError, match="process_index"):
        ExampleBatchSource(arrays, global_batch=4, seed=3, process_index=2, process_count=2)
    with pytest.raises(ValueError, match="not divisible"):
        ExampleBatchSource(arrays, global_batch=4, seed=3, process_count=3)
    with pytest.raises(ValueError, match="common length"):
        ExampleBatchSource({"a": np.zeros(3), "b": np.zeros(4)}, global_batch=2, seed=0)
