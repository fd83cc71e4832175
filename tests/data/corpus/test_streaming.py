"""The streaming LM pipeline (data/corpus/streaming.py, data/corpus/packing.py) and packed attention.

A small C4-format corpus (gzipped JSONL shards) from the embedded grammar; every expectation is
written out by hand or derived from an independent computation (numpy concatenation of the
documents, a model run on one document alone), never from the code under test itself.
"""
from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ConfigError, DataConfig, ModelConfig
from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus import readers
from jaxdepth.data.corpus.packing import WindowPacker, document_ids, features, iter_windows
from jaxdepth.data.corpus.pipeline import window_batches
from jaxdepth.data.corpus.prepare import prepare_streaming, sample_documents
from jaxdepth.data.corpus.readers import resolve_paths
from jaxdepth.data.corpus.streaming import deal_files, local_streams, streaming_dataset
from jaxdepth.data.corpus.tokenizer import EOS_ID, Tokenizer, train_tokenizer
from jaxdepth.errors import DataError
from jaxdepth.models.decoder import DecoderLM

N_FILES, SEQ, BATCH, STREAMS = 8, 24, 8, 4


def write_shard(path: Path, texts: list[str]) -> None:
    with gzip.open(path, "wt") as f:
        for t in texts:
            f.write(json.dumps({"url": "u", "text": t, "timestamp": "t"}) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(shard paths, tokenizer path, the texts of each shard)."""
    root = tmp_path_factory.mktemp("c4")
    texts = grammar.corpus_texts(240, seed=7)
    shards = []
    for i in range(N_FILES):
        path = root / f"c4-train.{i:05d}-of-{N_FILES:05d}.json.gz"
        write_shard(path, texts[i::N_FILES])
        shards.append(str(path))
    write_shard(root / "c4-validation.00000-of-00001.json.gz", grammar.corpus_texts(30, seed=8))
    tok = root / "tok.model"
    train_tokenizer(texts, 256).save(tok)
    return shards, str(tok), {s: texts[i::N_FILES] for i, s in enumerate(shards)}


def take(files, tok, n, *, state=None, workers=0, **kw):
    """(n batches, the iterator state after them) of a fresh iterator, optionally restored."""
    args = dict(seq_len=SEQ, global_batch=BATCH, n_streams=STREAMS, seed=3, tokenizer=tok,
                workers=workers)
    it = iter(streaming_dataset(files, **{**args, **kw}))
    if state is not None:
        it.set_state(json.loads(json.dumps(state)))  # as a checkpoint stores it
    out = [next(it) for _ in range(n)]
    state = it.get_state()
    if workers:
        it.close()
    return out, state


def same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y) == ["inputs", "segment_ids", "targets", "weights"]
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


# ----------------------------------------------------------------------------- packing

def test_features_follow_seqio_packing():
    tokens = np.array([5, 6, 7, 1, 8, 1, 9, 10], np.int32)
    segs = np.array([1, 1, 1, 1, 2, 2, 3, 3], np.int32)
    f = features(tokens, segs)
    assert f["targets"].tolist() == [5, 6, 7, 1, 8, 1, 9, 10]
    assert f["inputs"].tolist() == [0, 5, 6, 7, 0, 8, 0, 9]  # shifted within each segment
    assert f["positions"].tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    assert f["weights"].tolist() == [1.0] * 8
    padded = features(np.array([4, 1, 0, 0], np.int32), np.array([1, 1, 0, 0], np.int32))
    assert padded["inputs"].tolist() == [0, 4, 0, 0]
    assert padded["weights"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert padded["segment_ids"].tolist() == [1, 1, 0, 0]


def test_windows_are_the_documents_concatenated_and_cut():
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 100, size=n).astype(np.int32) for n in (3, 11, 1, 30, 7, 2)]
    stream = np.concatenate([document_ids(d.tolist()) for d in docs])
    windows = list(iter_windows(iter(document_ids(d.tolist()) for d in docs), 8))
    assert len(windows) == -(-len(stream) // 8)
    flat = np.concatenate([w["targets"][w["weights"] > 0] for w in windows])
    assert np.array_equal(flat, stream)  # nothing lost, nothing repeated, in order
    # every window is full but the last; a segment ends at EOS or at the window's end
    assert all(w["weights"].all() for w in windows[:-1])
    for w in windows:
        seg, tgt = w["segment_ids"], w["targets"]
        for s in set(seg[seg > 0].tolist()):
            idx = np.flatnonzero(seg == s)
            assert np.array_equal(idx, np.arange(idx[0], idx[-1] + 1))  # contiguous
            assert tgt[idx[-1]] == EOS_ID or idx[-1] == len(seg) - 1
    # a 30-token document spans windows: its pieces are new segments starting at position 0
    assert sum(w["positions"][0] == 0 for w in windows) == len(windows)


def test_windows_read_only_the_documents_they_need():
    read = []

    def docs():
        for i in range(1000):
            read.append(i)
            yield np.full(5, 7, np.int32)

    out = list(itertools.islice(iter_windows(docs(), 10), 3))
    assert len(out) == 3 and all(w["weights"].all() for w in out)
    assert len(read) == 6


def test_packer_carries_a_long_document_over():
    p = WindowPacker(4)
    docs = iter([np.arange(10, 20, dtype=np.int32), np.array([3, 1], np.int32)])
    w1, s1 = p.window(lambda: next(docs))
    w2, s2 = p.window(lambda: next(docs))
    w3, s3 = p.window(lambda: next(docs))
    assert w1.tolist() == [10, 11, 12, 13] and w2.tolist() == [14, 15, 16, 17]
    assert w3.tolist() == [18, 19, 3, 1] and s3.tolist() == [1, 1, 2, 2]
    assert (p.offset, len(p.doc)) == (2, 2)


def test_window_batches_pad_the_last_batch():
    windows = list(iter_windows(iter([np.arange(3, 30, dtype=np.int32)]), 4))  # 7 windows
    batches = window_batches(windows, 3)
    assert [b["inputs"].shape for b in batches] == [(3, 4)] * 3
    assert batches[-1]["weights"].sum() == 27 - 24
    assert sum(b["weights"].sum() for b in batches) == 27


# ----------------------------------------------------------------------------- the stream

def test_a_stream_is_its_files_documents_in_order(corpus):
    """Stream s reads files s, s+S, ... in a seeded order; its packed targets are those
    files' documents (tokenized, EOS after each) concatenated in that order."""
    files, tok_path, texts = corpus
    tok = Tokenizer.load(tok_path)
    (batch,), _ = take(files, tok_path, 1, global_batch=STREAMS * 6)  # 6 rows per stream
    rows = BATCH // STREAMS * 3
    for s, mine in enumerate(deal_files(files, STREAMS)):
        assert mine == tuple(files[s::STREAMS])
        order = np.random.default_rng([3, s, 0]).permutation(len(mine))
        expected = np.concatenate([document_ids(tok.encode(t)) for i in order
                                   for t in texts[mine[i]]])
        got = batch["targets"][s * rows:(s + 1) * rows].reshape(-1)
        assert np.array_equal(got, expected[:len(got)])


def test_batch_is_a_function_of_seed_step_and_files(corpus):
    files, tok, _ = corpus
    a, _ = take(files, tok, 5)
    b, _ = take(files, tok, 5)
    same(a, b)
    c, _ = take(files, tok, 5, seed=4)
    assert not np.array_equal(a[4]["targets"], c[4]["targets"])
    assert all(x["weights"].all() for x in a)  # training windows are always full
    # epochs: a stream that has read all its files starts again in a new order
    long, _ = take(files, tok, 60)
    assert not np.array_equal(long[0]["targets"], long[-1]["targets"])


def test_worker_processes_do_not_change_the_batches(corpus):
    files, tok, _ = corpus
    ref, _ = take(files, tok, 6)
    got, state = take(files, tok, 6, workers=2)
    same(ref, got)
    # and a two-worker loader resumes exactly from its checkpointed state
    _, mid = take(files, tok, 3, workers=2)
    rest, _ = take(files, tok, 3, workers=2, state=mid)
    same(ref[3:], rest)


def test_resume_from_saved_state_is_exact(corpus):
    files, tok, _ = corpus
    ref, _ = take(files, tok, 40)  # past the end of every stream's first epoch
    for k in (1, 7, 23):
        _, state = take(files, tok, k)
        rest, _ = take(files, tok, 40 - k, state=state)
        same(ref[k:], rest)


def test_processes_read_disjoint_files_and_together_the_global_batch(corpus, monkeypatch):
    files, tok, _ = corpus
    opened: dict[int, set] = {}
    real = readers.iter_documents
    current = [None]

    def spy(path, *a, **kw):
        opened.setdefault(current[0], set()).add(path)
        return real(path, *a, **kw)

    monkeypatch.setattr("jaxdepth.data.corpus.streaming.iter_documents", spy)
    current[0] = "one"
    whole, _ = take(files, tok, 100)  # > one epoch of every stream
    halves = []
    for p in range(2):
        current[0] = p
        halves.append(take(files, tok, 100, process_index=p, process_count=2)[0])
    for w, h0, h1 in zip(whole, *halves):
        for k in w:
            assert np.array_equal(w[k], np.concatenate([h0[k], h1[k]]))
    assert opened[0].isdisjoint(opened[1])
    assert opened[0] | opened[1] == set(files) == opened["one"]
    assert local_streams(STREAMS, BATCH, 1, 2) == range(2, 4)


def test_impossible_layouts_name_the_setting(corpus):
    files, tok, _ = corpus
    with pytest.raises(ConfigError, match="data.streams: 4 streams do not divide data.batch_size=6"):
        take(files, tok, 1, global_batch=6)
    with pytest.raises(ConfigError, match="data.streams: 4 streams do not split over 3 processes"):
        take(files, tok, 1, process_count=3)
    with pytest.raises(ConfigError, match="data.workers: 3 loader workers"):
        take(files, tok, 1, workers=3)
    with pytest.raises(ConfigError, match="data.streams: 16 streams need at least 16 corpus files, got 8"):
        take(files, tok, 1, n_streams=16, global_batch=16)
    with pytest.raises(ConfigError, match="data.streams"):
        DataConfig(streaming=True, streams=5, batch_size=32)


def test_malformed_line_is_named_by_file_and_line(tmp_path, corpus):
    _, tok, _ = corpus
    good = grammar.corpus_texts(40, seed=1)
    files = []
    for i in range(2):
        path = tmp_path / f"s{i}.jsonl.gz"
        write_shard(path, good)
        files.append(str(path))
    with gzip.open(files[1], "at") as f:
        f.write('{"text": "unterminated\n')
    for workers in (0, 1):
        with pytest.raises(Exception, match=rf"{files[1]}:41: malformed JSON"):
            take(files, tok, 200, n_streams=2, global_batch=2, workers=workers)


def test_truncated_gzip_is_named(tmp_path, corpus):
    _, tok, _ = corpus
    path = tmp_path / "cut.json.gz"
    write_shard(path, grammar.corpus_texts(400, seed=2))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=rf"{path}: truncated or corrupt gzip"):
        take([str(path)], tok, 3000, n_streams=1, global_batch=1)


def test_state_of_a_changed_corpus_is_refused(tmp_path, corpus):
    _, tok, texts = corpus
    paths = []
    for i in range(2):
        p = tmp_path / f"f{i}.jsonl"
        p.write_text("".join(json.dumps({"text": t}) + "\n" for t in grammar.corpus_texts(50, seed=i)))
        paths.append(str(p))
    _, state = take(paths, tok, 5, n_streams=2, global_batch=2)
    for p in paths:
        Path(p).write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"f0.jsonl: changed since the checkpoint was written "
                                        r"\(size \d+ -> 14 bytes\) \(and 1 more change\)"):
        take(paths, tok, 1, n_streams=2, global_batch=2, state=state)


# ----------------------------------------------------------------------------- files, tokenizer

def test_corpus_spec_takes_files_directories_and_globs(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("x\n")
    assert resolve_paths(f"{tmp_path}/*.jsonl", "data.corpus") == [str(tmp_path / "a.jsonl"),
                                                                   str(tmp_path / "b.jsonl")]
    assert resolve_paths(f"{tmp_path / 'sub'},{tmp_path / 'c.txt'},{tmp_path}/a.*",
                         "data.corpus") == [str(tmp_path / "sub" / "x.txt"),
                                            str(tmp_path / "c.txt"), str(tmp_path / "a.jsonl")]
    with pytest.raises(FileNotFoundError, match=r"data.valid: no file matches '.*\*.gz'"):
        resolve_paths(f"{tmp_path}/*.gz", "data.valid")


def test_tokenizer_sample_is_drawn_across_shards(corpus):
    files, _, texts = corpus
    sample = sample_documents(files, 20)  # ceil(20 / 8) = 3 from each shard until 20
    expected = [t for f in files for t in texts[f][:3]][:20]
    assert sample == expected


def test_prepare_streaming_refuses_grammar_and_packs_validation(tmp_path, corpus):
    files, tok, _ = corpus
    with pytest.raises(ConfigError, match="data.corpus: data.streaming reads a corpus of files"):
        prepare_streaming(DataConfig(streaming=True), 256, tmp_path, True)
    with pytest.raises(ConfigError, match="data.valid: data.streaming reads validation"):
        prepare_streaming(DataConfig(streaming=True, corpus=files[0]), 256, tmp_path, True)
    valid = str(Path(files[0]).parent / "c4-validation.*")
    cfg = DataConfig(streaming=True, corpus=",".join(files), valid=valid, tokenizer=tok, seq_len=SEQ)
    capped = prepare_streaming(cfg, 256, tmp_path / "a", True, max_valid_batches=2, batch_size=3)
    whole = prepare_streaming(cfg, 256, tmp_path / "b", True, batch_size=3)
    assert len(capped.valid) == 2 and len(whole.valid) > 2
    for x, y in zip(capped.valid, whole.valid):
        assert np.array_equal(x["targets"], y["targets"]) and x["targets"].shape == (3, SEQ)
    # every validation token is scored once: the documents, concatenated, in file order
    tok_ = Tokenizer.load(tok)
    docs = grammar.corpus_texts(30, seed=8)
    stream = np.concatenate([document_ids(tok_.encode(d)) for d in docs])
    scored = np.concatenate([b["targets"][b["weights"] > 0] for b in whole.valid])
    assert np.array_equal(scored, stream)
    assert capped.files == files and capped.valid_docs[0] == grammar.corpus_texts(30, seed=8)[0]


# ----------------------------------------------------------------------------- packed attention

@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, d_ff=64, n_heads=4, rel_buckets=8,
                      rel_max_distance=16)
    return DecoderLM(cfg, key=jax.random.key(1))


def _packed(docs: list[np.ndarray], T: int):
    tokens, segs = np.zeros(T, np.int32), np.zeros(T, np.int32)
    at = 0
    for i, d in enumerate(docs):
        tokens[at:at + len(d)], segs[at:at + len(d)] = d, i + 1
        at += len(d)
    return jnp.asarray(tokens[None]), jnp.asarray(segs[None])


@pytest.mark.parametrize("attention", ["einsum", "dot_product"])
def test_documents_in_one_window_do_not_see_each_other(model, attention):
    m = model.with_options(attention=attention)
    rng = np.random.default_rng(0)
    d1, d1b = rng.integers(3, 64, 9), rng.integers(3, 64, 9)
    d2 = rng.integers(3, 64, 12)
    tok_a, seg = _packed([d1, d2], 24)
    tok_b, _ = _packed([d1b, d2], 24)
    la = m(tok_a, segment_ids_BT=seg)
    lb = m(tok_b, segment_ids_BT=seg)
    # changing document 1 leaves document 2's logits as they were ...
    np.testing.assert_array_equal(np.asarray(la[0, 9:21]), np.asarray(lb[0, 9:21]))
    assert not np.allclose(la[0, :9], lb[0, :9])
    # ... and document 2 at offset 9 is what it is alone at offset 0 (relative positions
    # inside a document are its own)
    alone = m(jnp.asarray(d2[None].astype(np.int32)))
    np.testing.assert_allclose(np.asarray(la[0, 9:21]), np.asarray(alone[0]), rtol=0, atol=2e-6)
    # without segment ids, document 2 does see document 1
    assert not np.allclose(m(tok_a)[0, 9:21], m(tok_b)[0, 9:21])


def test_one_segment_is_the_unpacked_model(model):
    tokens = jnp.asarray(np.random.default_rng(1).integers(3, 64, (2, 16)).astype(np.int32))
    np.testing.assert_array_equal(np.asarray(model(tokens)),
                                  np.asarray(model(tokens, segment_ids_BT=jnp.ones_like(tokens))))
