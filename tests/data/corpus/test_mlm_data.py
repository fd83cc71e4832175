import json

import numpy as np
import pytest

from jaxdepth.models.specs import MLMConfig
from jaxdepth.models.token_ids import N_SPECIAL
from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus.mlm_sop import (KIND_MASK, KIND_NONE, KIND_ORIGINAL, KIND_RANDOM,
                                          MLMBatchSource, MLMDocuments, eval_mlm_batches,
                                          grammar_documents, mlm_dataset,
                                          split_sentences, text_documents, tokenize_mlm_documents,
                                          word_start_table)
from jaxdepth.data.corpus.pipeline import lm_iterator
from jaxdepth.data.corpus.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, train_tokenizer

KEYS = ("tokens", "segments", "mask", "mask_kind", "mlm_positions", "mlm_ids", "mlm_weights",
        "sop_labels")
N_SAMPLE = 3000


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(grammar.corpus_texts(300, 0), 256)


@pytest.fixture(scope="module")
def docs(tok):
    return tokenize_mlm_documents(grammar_documents(300, 1), tok)


def sample(docs, vocab_size, cfg, n=N_SAMPLE, seed=0):
    src = MLMBatchSource(docs, cfg, vocab_size, global_batch=1, seed=seed)
    return [src.example(0, r) for r in range(n)]


@pytest.fixture(scope="module")
def default_sample(docs, tok):
    return sample(docs, tok.vocab_size, MLMConfig())


@pytest.fixture(scope="module")
def short_sample(docs, tok):
    # seq_len 24 < most two-sentence chunks: exercises truncation.
    return sample(docs, tok.vocab_size, MLMConfig(seq_len=24, max_predictions=5), n=1000)


def seps(tokens):
    return np.flatnonzero(tokens == SEP_ID)


def is_subarray(x, y):
    x, y = list(x), list(y)
    return any(y[i:i + len(x)] == x for i in range(len(y) - len(x) + 1))


def doc_sentences(docs, d, idx):
    first = int(docs.doc_offsets[d])
    return np.concatenate([docs.sentence(first + s) for s in idx])


@pytest.mark.parametrize("which", ["default_sample", "short_sample"])
def test_layout(which, request):
    examples = request.getfixturevalue(which)
    T = 128 if which == "default_sample" else 24
    P = 20 if which == "default_sample" else 5
    n_full = 0
    for ex, info in examples:
        assert ex["tokens"].shape == ex["segments"].shape == ex["mask"].shape == (T,)
        assert ex["mask_kind"].shape == (T,)
        assert ex["mlm_positions"].shape == ex["mlm_ids"].shape == ex["mlm_weights"].shape == (P,)
        assert ex["sop_labels"].shape == ()
        for k in KEYS:
            assert ex[k].dtype == (np.float32 if k == "mlm_weights" else np.int32), k
        orig = info.original
        assert orig[0] == CLS_ID and ex["tokens"][0] == CLS_ID
        s1, s2 = seps(orig)  # exactly two
        np.testing.assert_array_equal(seps(ex["tokens"]), [s1, s2])
        assert s1 >= 2 and s2 >= s1 + 2  # both segments non-empty
        assert np.sum(orig == CLS_ID) == 1
        pos = np.arange(T)
        np.testing.assert_array_equal(ex["segments"], ((pos > s1) & (pos <= s2)).astype(np.int32))
        np.testing.assert_array_equal(ex["mask"], (pos <= s2).astype(np.int32))
        assert np.all(ex["tokens"][s2 + 1:] == PAD_ID) and np.all(orig[s2 + 1:] == PAD_ID)
        assert np.all(orig[1:s2][orig[1:s2] != SEP_ID] >= N_SPECIAL)
        n_full += s2 + 1 == T
    if which == "short_sample":
        assert n_full > 0.8 * len(examples)  # truncated to exactly seq_len


@pytest.mark.parametrize("which", ["default_sample", "short_sample"])
def test_segments_are_consecutive_document_text(which, request, docs):
    examples = request.getfixturevalue(which)
    truncated = 0
    for ex, info in examples:
        s1, s2 = seps(info.original)
        seg1, seg2 = info.original[1:s1], info.original[s1 + 1:s2]
        text1 = doc_sentences(docs, info.doc, info.first_sentences)
        text2 = doc_sentences(docs, info.doc, info.second_sentences)
        # Truncation removes tokens from the front or back only: contiguous pieces remain.
        assert is_subarray(seg1, text1) and is_subarray(seg2, text2)
        if len(seg1) + len(seg2) < len(text1) + len(text2):
            truncated += 1
            assert s2 + 1 == ex["tokens"].shape[0]
        else:
            np.testing.assert_array_equal(seg1, text1)
            np.testing.assert_array_equal(seg2, text2)
        first, second = info.first_sentences, info.second_sentences
        assert list(first) == list(range(first[0], first[-1] + 1))
        assert list(second) == list(range(second[0], second[-1] + 1))
        if ex["sop_labels"] == 0:
            assert first[-1] + 1 == second[0]  # A then B, adjacent in the document
        else:
            assert second[-1] + 1 == first[0]  # swapped
    if which == "short_sample":
        assert truncated > 0.5 * len(examples)


def test_sop_swap_rate(default_sample):
    labels = np.array([ex["sop_labels"] for ex, _ in default_sample])
    assert set(np.unique(labels)) == {0, 1}
    assert abs(labels.mean() - 0.5) < 0.03


def test_sop_disabled(docs, tok):
    exs = sample(docs, tok.vocab_size, MLMConfig(sop=False), n=300)
    assert all(ex["sop_labels"] == 0 for ex, _ in exs)
    assert all(info.first_sentences[-1] < info.second_sentences[0] for _, info in exs)


def test_masking_outputs_are_consistent(default_sample, tok):
    V = tok.vocab_size
    for ex, info in default_sample:
        orig, kind, toks = info.original, ex["mask_kind"], ex["tokens"]
        sel = np.flatnonzero(kind != KIND_NONE)
        m = int(ex["mlm_weights"].sum())
        assert len(sel) == m and 1 <= m <= info.n_to_predict
        np.testing.assert_array_equal(ex["mlm_weights"], (np.arange(20) < m).astype(np.float32))
        np.testing.assert_array_equal(ex["mlm_positions"][:m], sel)  # ascending
        assert np.all(ex["mlm_positions"][m:] == 0) and np.all(ex["mlm_ids"][m:] == 0)
        np.testing.assert_array_equal(ex["mlm_ids"][:m], orig[sel])
        # Never [CLS], [SEP] or padding.
        assert np.all(kind[(orig == CLS_ID) | (orig == SEP_ID) | (ex["mask"] == 0)] == 0)
        assert np.all(toks[kind == KIND_MASK] == MASK_ID)
        np.testing.assert_array_equal(toks[kind == KIND_ORIGINAL], orig[kind == KIND_ORIGINAL])
        rnd = toks[kind == KIND_RANDOM]
        assert np.all((rnd >= N_SPECIAL) & (rnd < V))
        np.testing.assert_array_equal(toks[kind == KIND_NONE], orig[kind == KIND_NONE])


def test_mask_rate_and_budget(default_sample):
    n_real = np.array([ex["mask"].sum() - 3 for ex, _ in default_sample])
    n_sel = np.array([ex["mlm_weights"].sum() for ex, _ in default_sample])
    budget = np.array([info.n_to_predict for _, info in default_sample])
    expected = np.minimum(20, np.maximum(1, np.floor(0.15 * n_real + 0.5)))
    np.testing.assert_array_equal(budget, expected)
    assert np.all(n_sel <= budget)
    assert np.mean(n_sel == budget) > 0.95
    assert abs(n_sel.sum() / n_real.sum() - 0.15) < 0.01


def test_max_predictions_cap(docs, tok):
    cfg = MLMConfig(mask_rate=0.5, max_predictions=10)
    for ex, info in sample(docs, tok.vocab_size, cfg, n=300):
        n_real = ex["mask"].sum() - 3
        assert info.n_to_predict == min(10, max(1, int(0.5 * n_real + 0.5)))
        assert ex["mlm_weights"].sum() <= 10
        assert ex["mlm_positions"].shape == (10,)


def test_replacement_rates(default_sample):
    kinds = np.concatenate([ex["mask_kind"][ex["mask_kind"] > 0] for ex, _ in default_sample])
    assert len(kinds) > 10000
    rates = [np.mean(kinds == k) for k in (KIND_MASK, KIND_RANDOM, KIND_ORIGINAL)]
    np.testing.assert_allclose(rates, [0.8, 0.1, 0.1], atol=0.02)
    rnd = np.concatenate([ex["tokens"][ex["mask_kind"] == KIND_RANDOM] for ex, _ in default_sample])
    assert len(np.unique(rnd)) > 100  # spread over the vocabulary, not one id


def test_ngrams_are_whole_words_with_1_over_n_lengths(default_sample, docs, tok):
    starts = word_start_table(tok)
    drawn = []
    for ex, info in default_sample:
        orig, seg = info.original, ex["segments"]
        s1, s2 = seps(orig)
        covered = np.zeros(len(orig), bool)
        for g in info.ngrams:
            assert 1 <= g.n_words <= g.n_drawn <= g.n_avail <= 3
            assert not covered[g.start:g.end].any()  # no overlap
            covered[g.start:g.end] = True
            assert np.all(orig[g.start:g.end] != SEP_ID)  # never crosses [SEP]
            assert seg[g.start] == seg[g.end - 1]
            # Whole words: begins at a word start (or a segment start), ends before one.
            assert starts[orig[g.start]] or g.start in (1, s1 + 1)
            assert orig[g.end] == SEP_ID or starts[orig[g.end]]
            assert np.sum(starts[orig[g.start + 1:g.end]]) == g.n_words - 1
            if g.n_avail == 3:
                drawn.append(g.n_drawn)
        np.testing.assert_array_equal(covered, ex["mask_kind"] > 0)
    drawn = np.array(drawn)
    assert len(drawn) > 5000
    np.testing.assert_allclose([np.mean(drawn == n) for n in (1, 2, 3)],
                               [6 / 11, 3 / 11, 2 / 11], atol=0.03)


def test_batches_are_pure_functions_of_seed_and_index(docs, tok):
    cfg = MLMConfig(seq_len=64, max_predictions=10)
    a = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=8, seed=3)
    b = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=8, seed=3)
    c = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=8, seed=4)
    for k in KEYS:
        np.testing.assert_array_equal(a[5][k], b[5][k])
    assert a[5]["tokens"].shape == (8, 64) and a[5]["sop_labels"].shape == (8,)
    assert not np.array_equal(a[5]["tokens"], c[5]["tokens"])
    assert not np.array_equal(a[5]["tokens"], a[6]["tokens"])
    # Row r is the example of rng [seed, i, r].
    np.testing.assert_array_equal(a[5]["tokens"][3], a.example(5, 3)[0]["tokens"])
    # Two processes split the rows of one global batch.
    p0 = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=8, seed=3, process_index=0,
                        process_count=2)
    p1 = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=8, seed=3, process_index=1,
                        process_count=2)
    for k in KEYS:
        np.testing.assert_array_equal(np.concatenate([p0[5][k], p1[5][k]]), a[5][k])
    with pytest.raises(ValueError, match="divisible"):
        MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=7, seed=3, process_count=2)


def test_iterator_state_restores(docs, tok):
    cfg = MLMConfig(seq_len=32, max_predictions=5)
    ds = mlm_dataset(docs, cfg, tok.vocab_size, global_batch=4, seed=0)
    it = lm_iterator(ds)
    for _ in range(3):
        next(it)
    assert it.get_state() == {"next_index": 3}
    it2 = lm_iterator(ds)
    it2.set_state({"next_index": 7})
    got = next(it2)
    for k in KEYS:
        np.testing.assert_array_equal(got[k], ds[7][k])
    got = next(lm_iterator(ds, start=7))
    np.testing.assert_array_equal(got["tokens"], ds[7]["tokens"])


def test_eval_batches_are_fixed(docs, tok):
    cfg = MLMConfig(seq_len=32, max_predictions=5)
    ev = eval_mlm_batches(docs, cfg, tok.vocab_size, n_batches=3, batch_size=4, seed=9)
    ev2 = eval_mlm_batches(docs, cfg, tok.vocab_size, n_batches=3, batch_size=4, seed=9)
    src = MLMBatchSource(docs, cfg, tok.vocab_size, global_batch=4, seed=9)
    assert len(ev) == 3
    for i in range(3):
        assert ev[i]["tokens"].shape == (4, 32)
        for k in KEYS:
            np.testing.assert_array_equal(ev[i][k], ev2[i][k])
            np.testing.assert_array_equal(ev[i][k], src[i][k])


def test_grammar_documents():
    ref = grammar.corpus(5, 2)
    got = grammar_documents(5, 2)
    assert got == [[" ".join(s.words) for s in doc] for doc in ref]


def test_tokenize_keeps_documents_of_two_sentences(tok):
    texts = [["the cat saw a dog .", "a dog ran ."], ["a bird sang ."],
             ["the cat ran .", "", "x ."]]
    docs = tokenize_mlm_documents(texts, tok)
    assert docs.n_docs == 2 and docs.n_sentences == 4  # the empty sentence is dropped too
    np.testing.assert_array_equal(docs.sentence(2), tok.encode("the cat ran ."))
    np.testing.assert_array_equal(docs.word_start, word_start_table(tok)[docs.tokens])


def test_no_document_with_two_sentences_raises(tok):
    with pytest.raises(ValueError, match=r"no document with >= 2"):
        tokenize_mlm_documents([["a cat ran ."], ["the dog sang ."]], tok)
    with pytest.raises(ValueError, match=r"no document with >= 2"):
        tokenize_mlm_documents([], tok)
    with pytest.raises(ValueError, match=r"no document with >= 2"):
        MLMBatchSource([[[7, 8, 9]], [[10]]], MLMConfig(), 256, global_batch=2, seed=0)


@pytest.mark.parametrize("field,value", [
    ("seq_len", 4), ("seq_len", 12.5), ("mask_rate", 0.0), ("mask_rate", 1.5),
    ("max_predictions", 0), ("max_ngram", 0), ("p_mask", 1.2), ("p_random", -0.1),
    ("short_seq_prob", 2.0), ("sop", "yes"), ("mask_rate", float("nan")),
])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"MLMConfig\.{field}\b"):
        MLMConfig(**{field: value})


def test_probabilities_summing_over_one_name_p_random():
    with pytest.raises(ValueError, match=r"MLMConfig\.p_random.*exceeds 1"):
        MLMConfig(p_mask=0.95, p_random=0.1)
    MLMConfig(p_mask=0.9, p_random=0.1)  # exactly 1 is fine


def test_bad_vocab_size(docs, tok):
    with pytest.raises(ValueError, match="vocab_size"):
        MLMBatchSource(docs, MLMConfig(), 100, global_batch=2, seed=0)


def test_id_lists_work_without_a_tokenizer():
    docs = [[[10, 11, 12], [13, 14], [15, 16, 17, 18]], [[20, 21], [22]]]
    cfg = MLMConfig(seq_len=16, max_predictions=4)
    src = MLMBatchSource(docs, cfg, 30, global_batch=4, seed=0)
    assert isinstance(src.docs, MLMDocuments) and src.docs.n_docs == 2
    batch = src[0]
    assert batch["tokens"].shape == (4, 16) and np.all(batch["mlm_weights"].sum(1) >= 1)


def test_split_sentences():
    assert split_sentences(" The game began . It met 3 @.@ 5 sales ! Why ? end") == [
        "The game began .", "It met 3 @.@ 5 sales !", "Why ?", "end"]
    assert split_sentences("Plain text. Second one!Third") == ["Plain text.", "Second one!Third"]
    assert split_sentences("  ") == []


def test_text_documents_wikitext_and_jsonl(tmp_path):
    wiki = tmp_path / "wiki.txt"
    wiki.write_text(
        " \n = Title One = \n \n The first sentence . The second one ? Yes ! \n \n"
        " = = Section = = \n \n Another paragraph . With two sentences . \n \n"
        " = Title Two = \n \n Single sentence . \n \n", encoding="utf-8")
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"text": "A b. C d!\nE f?"}) + "\n", encoding="utf-8")
    assert text_documents([wiki, jsonl]) == [
        ["The first sentence .", "The second one ?", "Yes !"],
        ["Another paragraph .", "With two sentences ."],
        ["Single sentence ."],
        ["A b.", "C d!", "E f?"],
    ]
    # Headings glued to a paragraph (no blank line) still end the document.
    glued = tmp_path / "glued.txt"
    glued.write_text("One . Two .\n = Head = \nThree . Four .\n", encoding="utf-8")
    assert text_documents([glued]) == [["One .", "Two ."], ["Three .", "Four ."]]


def test_wikitext2_valid_reads(shared_data):
    path = shared_data / "wikitext-2" / "valid.txt"
    if not path.is_file():
        pytest.skip("wikitext-2 is not present")
    docs = text_documents([path])
    assert len(docs) > 100 and sum(len(d) >= 2 for d in docs) > 100
    assert all(s and not s.startswith("= ") for d in docs for s in d)
