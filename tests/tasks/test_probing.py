import dataclasses

import numpy as np
import pytest

from jaxdepth.data.embedded import grammar
from jaxdepth.data.embedded.grammar import NP, Clause, realize, to_passive
from jaxdepth.data.finetune import probing
from jaxdepth.data.finetune.probing import (PROBE_TASKS, ROLE_NAMES, SENTENCE_TASKS, SPLITS,
                                            build_probe_data, label_names, make_probe_data,
                                            sentence_roles)
from jaxdepth.data.corpus.tokenizer import CLS_ID, PAD_ID, SEP_ID, train_tokenizer

N_TRAIN, N_EVAL, SEQ_LEN, SEED = 40, 10, 40, 3
KW = dict(n_train=N_TRAIN, n_eval=N_EVAL, seed=SEED, seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(grammar.corpus_texts(300, 0), 256)


@pytest.fixture(scope="module")
def probe(tok):
    """task -> (data, sentences per split, stats)."""
    out = {}
    for task in PROBE_TASKS:
        data, stats = build_probe_data(task, tok, **KW)
        sents, stats2 = probe_sentences(task, tok, **KW)
        assert stats2 == stats
        out[task] = (data, sents, stats)
    return out


def probe_sentences(task, tok, *, n_train, n_eval, seed, seq_len):
    """The sentences of each split, in row order, as `make_probe_data` encodes them."""
    items, stats = probing._select(task, tok, n_train, n_eval, seed, seq_len,
                                   grammar.GrammarConfig())
    return {split: [it.sentence for it in its] for split, its in items.items()}, stats


def real_ids(row_tokens, row_mask):
    """The sentence's ids: between [CLS] and [SEP]."""
    n = int(row_mask.sum())
    return row_tokens[1:n - 1]


def texts(tok, batch):
    return [tok.decode(real_ids(t, m)) for t, m in zip(batch["tokens"], batch["mask"])]


def test_label_names_and_roles():
    assert label_names("tense") == ("past", "present")
    assert label_names("subj_number") == label_names("obj_number") == ("sg", "pl")
    assert label_names("roles") == ROLE_NAMES
    assert list(ROLE_NAMES) == sorted(set(grammar.ROLES))
    # every role the grammar produces (active and passive) is a ROLE_NAME
    produced = set()
    for s in grammar.generate(400, 0):
        produced.update(s.roles)
        p = to_passive(s)
        if p is not None:
            produced.update(p.roles)
    assert produced <= set(ROLE_NAMES)
    assert {"subj_det", "verb", "obj_noun", "punct", "cp_subj_noun", "aux", "by"} <= produced
    with pytest.raises(ValueError, match="unknown probing task"):
        label_names("voice")


@pytest.mark.parametrize("task", PROBE_TASKS)
def test_layout_and_sizes(probe, task):
    data, _, _ = probe[task]
    assert set(data) == set(SPLITS)
    for split, n in (("train", N_TRAIN), ("dev", N_EVAL), ("test", N_EVAL)):
        b = data[split]
        keys = {"tokens", "segments", "mask", "labels"} | ({"roles"} if task == "roles" else set())
        assert set(b) == keys
        for k, v in b.items():
            assert v.dtype == np.int32, k
        assert b["tokens"].shape == b["segments"].shape == b["mask"].shape == (n, SEQ_LEN)
        assert (b["segments"] == 0).all()
        lengths = b["mask"].sum(1)
        assert (lengths >= 3).all()
        for t, m, L in zip(b["tokens"], b["mask"], lengths):
            assert (m[:L] == 1).all() and (m[L:] == 0).all()
            assert t[0] == CLS_ID and t[L - 1] == SEP_ID
            assert (t[L:] == PAD_ID).all()
            assert not np.isin(t[1:L - 1], [CLS_ID, SEP_ID, PAD_ID]).any()
        if task == "roles":
            assert b["labels"].shape == (n, SEQ_LEN)
            np.testing.assert_array_equal(b["labels"], b["roles"])
        else:
            assert b["labels"].shape == (n,)


@pytest.mark.parametrize("task", SENTENCE_TASKS)
def test_balanced(probe, task):
    data, _, _ = probe[task]
    for split in SPLITS:
        labels = data[split]["labels"]
        counts = np.bincount(labels, minlength=2)
        assert counts.tolist() == [len(labels) // 2] * 2, (split, counts)
    # shuffled, not one class then the other
    assert len(set(data["train"]["labels"][: N_TRAIN // 2].tolist())) == 2


@pytest.mark.parametrize("task", PROBE_TASKS)
def test_labels_agree_with_sentences(tok, probe, task):
    data, sents, _ = probe[task]
    for split in SPLITS:
        b, ss = data[split], sents[split]
        assert texts(tok, b) == [s.text for s in ss]
        if task == "roles":
            for row, s in enumerate(ss):
                ids, roles = sentence_roles(s, tok)
                L = len(ids)
                np.testing.assert_array_equal(b["tokens"][row, 1:L + 1], ids)
                np.testing.assert_array_equal(b["roles"][row, 1:L + 1], roles)
                assert b["roles"][row, 0] == -1 and (b["roles"][row, L + 1:] == -1).all()
                # each word's role appears, in order, over its pieces
                per_piece = [ROLE_NAMES[r] for r in roles]
                collapsed = [r for i, r in enumerate(per_piece) if i == 0 or r != per_piece[i - 1]]
                expect = [r for i, r in enumerate(s.roles) if i == 0 or r != s.roles[i - 1]]
                assert collapsed == expect
                # the pieces of word k (grouped at "▁") all carry word k's role
                starts = [tok.id_to_piece(i).startswith("\u2581") for i in ids.tolist()]
                word = np.cumsum(starts) - 1
                assert word[-1] == len(s.words) - 1
                assert per_piece == [s.roles[w] for w in word]
        else:
            names = label_names(task)
            for lab, s in zip(b["labels"].tolist(), ss):
                assert names[lab] == getattr(s, task)


def _surface_feature(task, s):
    """The feature read off the words alone (no past form equals a present one, and no
    singular noun equals a plural one, in the lexicon)."""
    if task == "tense":
        i = s.roles.index("verb")
        past_forms = {forms[1] for forms in grammar.VERB_FORMS.values()}
        return "past" if s.words[i] in past_forms else "present"
    slot = "subj_noun" if task == "subj_number" else "obj_noun"
    word = s.words[s.roles.index(slot)]
    return "pl" if word in set(grammar.NOUN_PLURAL.values()) else "sg"


@pytest.mark.parametrize("task", SENTENCE_TASKS)
def test_labels_agree_with_regenerated_sentences(tok, probe, task):
    """Regenerate each sentence from its tree and read the feature off its words."""
    data, sents, _ = probe[task]
    names = label_names(task)
    for split in SPLITS:
        for text, lab, s in zip(texts(tok, data[split]), data[split]["labels"].tolist(),
                                sents[split]):
            again = realize(s.tree)
            assert again.text == text
            assert getattr(again, task) == names[lab] == _surface_feature(task, again)


@pytest.mark.parametrize("task", PROBE_TASKS)
def test_splits_disjoint_and_unique(tok, probe, task):
    data, _, _ = probe[task]
    per_split = {split: texts(tok, data[split]) for split in SPLITS}
    all_texts = [t for ts in per_split.values() for t in ts]
    assert len(set(all_texts)) == len(all_texts)


def test_duplicates_skipped(tok):
    # A tiny language (name + intransitive verb + tense): repeats are certain at this size.
    cfg = grammar.GrammarConfig(max_pp_depth=0, max_cp_depth=0, p_name=1.0, p_transitive=0.0)
    data, stats = build_probe_data("tense", tok, n_train=300, n_eval=50, seed=0, seq_len=16,
                                   cfg=cfg)
    assert stats.n_duplicate > 0
    all_texts = [t for split in SPLITS for t in texts(tok, data[split])]
    assert len(all_texts) == 400 == len(set(all_texts))


@pytest.mark.parametrize("task", ["tense", "roles"])
def test_deterministic_and_seed_dependent(tok, probe, task):
    data, _, _ = probe[task]
    again = make_probe_data(task, tok, **KW)
    for split in SPLITS:
        for k in data[split]:
            np.testing.assert_array_equal(again[split][k], data[split][k])
    other = make_probe_data(task, tok, **{**KW, "seed": SEED + 1})
    assert set(texts(tok, other["train"])) != set(texts(tok, data["train"]))
    assert not np.array_equal(other["train"]["tokens"], data["train"]["tokens"])


def test_obj_number_only_transitive(probe):
    _, sents, _ = probe["obj_number"]
    for split in SPLITS:
        for s in sents[split]:
            assert s.tree.obj is not None and s.obj_number is not None
            assert s.tree.verb in grammar.TRANSITIVE_VERBS
            assert "obj_noun" in s.roles


def test_role_alignment_by_hand(tok):
    s = realize(Clause("see", "past", NP("dog", "the", "sg"), NP("cat", "a", "sg")))
    assert s.text == "the dog saw a cat ."
    ids, roles = sentence_roles(s, tok)
    assert ids.dtype == roles.dtype == np.int32
    np.testing.assert_array_equal(ids, tok.encode(s.text))
    # Align pieces to words by character offsets (independently of the "▁" grouping).
    pieces = [tok.id_to_piece(i) for i in ids]
    spelled = "".join(pieces).replace("\u2581", " ")
    assert spelled.strip() == s.text
    offset, piece_word = len(spelled) - len(spelled.lstrip()), []
    for p in pieces:
        chars = p.replace("\u2581", " ")
        first = offset + (len(chars) - len(chars.lstrip()))  # first non-space char of the piece
        piece_word.append(len(spelled[:first + 1].split()) - 1)
        offset += len(chars)
    by_hand = ["subj_det", "subj_noun", "verb", "obj_det", "obj_noun", "punct"]
    assert list(s.roles) == by_hand
    assert [ROLE_NAMES[r] for r in roles] == [by_hand[w] for w in piece_word]
    assert sorted(set(piece_word)) == list(range(6))  # every word has a piece

    # and in a roles batch row: -1 on [CLS], [SEP] and padding
    data = make_probe_data("roles", tok, n_train=4, n_eval=2, seed=0, seq_len=48)
    row_mask = data["train"]["mask"][0]
    L = int(row_mask.sum())
    r = data["train"]["roles"][0]
    assert r[0] == -1 and r[L - 1] == -1 and (r[L:] == -1).all() and (r[1:L - 1] >= 0).all()


def test_unk_and_bad_words_raise(tok):
    s = realize(Clause("see", "past", NP("dog", "the", "sg"), NP("cat", "a", "sg")))
    bad = dataclasses.replace(s, words=("the", "d\u00f6g", "saw", "a", "cat", "."))
    with pytest.raises(ValueError, match="the d\u00f6g saw a cat"):
        sentence_roles(bad, tok)
    short = dataclasses.replace(s, roles=s.roles[:-1])
    with pytest.raises(ValueError, match="roles for 6 words"):
        sentence_roles(short, tok)


def test_long_sentences_skipped_not_truncated(tok):
    seq_len = 14
    data, stats = build_probe_data("roles", tok, n_train=30, n_eval=4, seed=1, seq_len=seq_len)
    sents, _ = probe_sentences("roles", tok, n_train=30, n_eval=4, seed=1, seq_len=seq_len)
    assert stats.n_too_long > 0
    assert stats.max_pieces <= seq_len - 2
    for split in SPLITS:
        b = data[split]
        assert b["tokens"].shape[1] == seq_len
        for t, m, s in zip(b["tokens"], b["mask"], sents[split]):
            # the whole sentence is there, [SEP] included
            assert tok.decode(real_ids(t, m)) == s.text
            assert t[int(m.sum()) - 1] == SEP_ID


def test_bad_arguments(tok):
    with pytest.raises(ValueError, match="unknown probing task"):
        make_probe_data("voice", tok, **KW)
    with pytest.raises(ValueError, match="multiple"):
        make_probe_data("tense", tok, **{**KW, "n_train": 41})
    with pytest.raises(ValueError, match="seq_len"):
        make_probe_data("roles", tok, **{**KW, "seq_len": 2})
    with pytest.raises(RuntimeError, match="seq_len"):
        make_probe_data("roles", tok, n_train=2, n_eval=0, seed=0, seq_len=3)
    # roles is token-level: any n_train
    assert len(make_probe_data("roles", tok, n_train=3, n_eval=1, seed=0,
                               seq_len=SEQ_LEN)["train"]["tokens"]) == 3
