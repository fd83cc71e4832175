"""NER and MLM fusion tasks (jaxdepth/tasks/ner.py, mlm.py) end to end through train(cfg),
and the data pieces they add: task directories, sentence encoding / decoding, HF word pieces.

Every reported number is checked against an independent recomputation: best-of over
evals.jsonl, test F1 of the reloaded final model, perplexity of the reloaded MLM model; FE
runs leave the backbone bit-identical to their source (a run of this project, or an HF dir).
"""
import json
import re
import math
import random
import shutil
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.analysis import entity_f1
from jaxdepth.config import Config, ConfigError
from jaxdepth.data.finetune import ner_sentences
from jaxdepth.data.finetune.ner_sentences import (CONLL_LABELS, LABELS, Sentence, decode_tags,
                                                  detect_format, encode_sentences, ner_labels,
                                                  read_split, read_wikiann, split_path)

SEQ_LEN = 32
TINY = {"arch": "encoder", "vocab_size": 64, "d_model": 32, "n_layers": 2, "d_ff": 64,
        "n_heads": 2}


def _arrays(tree):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def _assert_same_arrays(a, b):
    la, lb = _arrays(a), _arrays(b)
    assert jax.tree.structure(eqx.filter(a, eqx.is_array)) == \
        jax.tree.structure(eqx.filter(b, eqx.is_array))
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _cfg(run_dir, **sections) -> Config:
    base = {"model": dict(TINY),
            "data": {"seq_len": SEQ_LEN, "batch_size": 8, "grammar_docs": 200},
            "optim": {"name": "adamw", "lr": 1e-2, "schedule": "constant", "warmup_steps": 0,
                      "weight_decay": 0.01},
            "mesh": {"data": 1},
            "run": {"dir": str(run_dir), "steps": 6, "eval_every": 1000, "save_every": 1000,
                    "log_every": 10, "progress": False, "samples": 0, "eval_batches": 1}}
    for sec, vals in sections.items():
        base[sec] = {**base.get(sec, {}), **vals}
    return Config.from_dict(base)


# ----------------------------------------------------------------------------- a tiny WikiAnn

PER = [["John"], ["Mary"], ["Anna", "Smith"], ["Peter", "Lopez"], ["Ravi"]]
LOC = [["Paris"], ["Berlin"], ["New", "York"], ["Kenya"], ["Oslo"]]
ORG = [["Google"], ["Siemens"], ["Red", "Cross"], ["Nokia"], ["UNESCO"]]
TEMPLATES = [
    [("PER",), "visited", ("LOC",), "."],
    [("PER",), "works", "for", ("ORG",), "in", ("LOC",), "."],
    ["the", ("ORG",), "office", "opened", "in", ("LOC",), "."],
    [("ORG",), "hired", ("PER",), "yesterday", "."],
    ["we", "met", ("PER",), "and", ("PER",), "near", ("LOC",), "."],
]
WORDS_OUTSIDE = sorted({w for t in TEMPLATES for w in t if isinstance(w, str)})


def _sentences(n, seed):
    rng = random.Random(seed)
    pools = {"PER": PER, "LOC": LOC, "ORG": ORG}
    out = []
    for _ in range(n):
        toks, tags = [], []
        for part in rng.choice(TEMPLATES):
            if isinstance(part, str):
                toks.append(part)
                tags.append("O")
            else:
                typ = part[0]
                ent = rng.choice(pools[typ])
                toks += ent
                tags += [f"B-{typ}"] + [f"I-{typ}"] * (len(ent) - 1)
        out.append(Sentence(tuple(toks), tuple(tags)))
    return out


def _write_wikiann(path, sentences):
    path.write_text("\n\n".join("\n".join(f"en:{t}\t{g}" for t, g in zip(s.tokens, s.tags))
                                for s in sentences) + "\n")


@pytest.fixture(scope="module")
def wikiann_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("wikiann")
    for split, n, seed in (("train", 40, 0), ("dev", 10, 1), ("test", 10, 2)):
        _write_wikiann(d / split, _sentences(n, seed))
    return d


def _write_conll(path, sentences):
    lines = ["-DOCSTART- -X- -X- O", ""]
    for s in sentences:
        lines += [f"{t} NNP B-NP {g}" for t, g in zip(s.tokens, s.tags)] + [""]
    path.write_text("\n".join(lines))


# ----------------------------------------------------------------------------- 1. encode / decode

def _hand_words(table):
    return lambda words: [list(table[w]) for w in words]


def test_encode_sentences_layout_first_piece_and_padding():
    words = _hand_words({"John": [10], "playing": [11, 12], "Paris": [13]})
    s = Sentence(("John", "playing", "Paris"), ("B-PER", "O", "B-LOC"))
    arr, dropped = encode_sentences([s], words, LABELS, seq_len=8, max_words=4, cls_id=3,
                                    sep_id=4, pad_id=0)
    assert dropped == 0
    assert sorted(arr) == ["labels", "mask", "positions", "segments", "tokens"]
    np.testing.assert_array_equal(arr["tokens"], [[3, 10, 11, 12, 13, 4, 0, 0]])
    np.testing.assert_array_equal(arr["mask"], [[1, 1, 1, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(arr["segments"], np.zeros((1, 8)))
    # "playing" = 2 pieces: its label sits on piece 11 (position 2); 12 carries no label
    np.testing.assert_array_equal(arr["positions"], [[1, 2, 4, 0]])
    np.testing.assert_array_equal(arr["labels"], [[1, 0, 5, -1]])  # B-PER, O, B-LOC, none
    for k in arr:
        assert arr[k].dtype == np.int32

    # exactly fitting (CLS + 4 pieces + SEP = 6): nothing dropped, no padding
    arr, dropped = encode_sentences([s], words, LABELS, seq_len=6, max_words=4, cls_id=3,
                                    sep_id=4, pad_id=0)
    assert dropped == 0
    np.testing.assert_array_equal(arr["tokens"], [[3, 10, 11, 12, 13, 4]])
    np.testing.assert_array_equal(arr["mask"], [[1] * 6])


def test_encode_sentences_drops_the_tail_and_decode_fills_o():
    words = _hand_words({"John": [10], "playing": [11, 12], "Paris": [13],
                         **{c: [20 + i, 30] for i, c in enumerate("abcde")}})
    s1 = Sentence(("John", "playing", "Paris"), ("B-PER", "O", "B-LOC"))
    s2 = Sentence(tuple("abcde"), ("B-ORG", "I-ORG", "O", "B-PER", "O"))
    arr, dropped = encode_sentences([s1, s2], words, LABELS, seq_len=8, max_words=4, cls_id=3,
                                    sep_id=4, pad_id=0)
    # s2: 5 words x 2 pieces; [CLS] + 3 words + [SEP] = 8, so "d" and "e" do not fit
    assert dropped == 2
    np.testing.assert_array_equal(arr["tokens"][1], [3, 20, 30, 21, 30, 22, 30, 4])
    np.testing.assert_array_equal(arr["mask"][1], [1] * 8)
    np.testing.assert_array_equal(arr["positions"][1], [1, 3, 5, 0])
    np.testing.assert_array_equal(arr["labels"][1], [3, 4, 0, -1])

    pred = np.array([[1, 0, 5, 2], [3, 4, 0, 6]])  # slot 3 has no word: ignored
    tags = decode_tags(pred, arr["labels"], [3, 5], LABELS)
    assert tags == [["B-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O", "O", "O"]]
    # the dropped B-PER of s2 is a missed gold entity: 2 of 3 gold spans found, all predicted right
    gold = [list(s1.tags), list(s2.tags)]
    assert entity_f1.f1(gold, tags) == {"precision": 1.0, "recall": pytest.approx(0.75),
                                      "f1": pytest.approx(6 / 7)}

    # seq_len 5: [CLS] John play ##ing = 4 pieces, "Paris" + [SEP] would make 6
    arr, dropped = encode_sentences([s1], words, LABELS, seq_len=5, max_words=4, cls_id=3,
                                    sep_id=4, pad_id=0)
    assert dropped == 1
    np.testing.assert_array_equal(arr["tokens"], [[3, 10, 11, 12, 4]])
    np.testing.assert_array_equal(arr["labels"], [[1, 0, -1, -1]])
    assert decode_tags(np.array([[1, 0, 5, 5]]), arr["labels"], [3], LABELS) == \
        [["B-PER", "O", "O"]]


def test_encode_sentences_max_words_cap_and_errors():
    words = _hand_words({"John": [10], "playing": [11, 12], "Paris": [13], "void": []})
    s = Sentence(("John", "playing", "Paris"), ("B-PER", "O", "B-LOC"))
    arr, dropped = encode_sentences([s], words, LABELS, seq_len=8, max_words=2, cls_id=3,
                                    sep_id=4, pad_id=0)
    assert dropped == 1
    assert arr["positions"].shape == arr["labels"].shape == (1, 2)
    np.testing.assert_array_equal(arr["tokens"], [[3, 10, 11, 12, 4, 0, 0, 0]])
    np.testing.assert_array_equal(arr["positions"], [[1, 2]])
    np.testing.assert_array_equal(arr["labels"], [[1, 0]])
    assert decode_tags(np.array([[1, 0]]), arr["labels"], [3], LABELS) == [["B-PER", "O", "O"]]

    with pytest.raises(ValueError, match="B-MISC"):  # not a WikiAnn label
        encode_sentences([Sentence(("x",), ("B-MISC",))], _hand_words({"x": [7]}), LABELS,
                         seq_len=8, max_words=2, cls_id=3, sep_id=4, pad_id=0)
    with pytest.raises(ValueError, match="'void'"):
        encode_sentences([Sentence(("John", "void"), ("O", "O"))], words, LABELS, seq_len=8,
                         max_words=2, cls_id=3, sep_id=4, pad_id=0)


# ----------------------------------------------------------------------------- 2. task dirs

def test_wikiann_and_conll_directories(tmp_path):
    sents = _sentences(3, seed=5)
    wa = tmp_path / "wa"
    wa.mkdir()
    for split in ("train", "dev", "test"):
        _write_wikiann(wa / split, sents)
    assert detect_format(wa / "train") == "wikiann"
    assert ner_labels(wa) == LABELS
    assert [split_path(wa, s).name for s in ("train", "dev", "test")] == ["train", "dev", "test"]
    assert read_split(wa, "dev") == sents

    co = tmp_path / "conll"
    co.mkdir()
    iob1 = [Sentence(("EU", "rejects", "Peter", "Blackburn"), ("I-ORG", "O", "I-PER", "I-PER")),
            Sentence(("Paris", "Berlin", "Lyon"), ("I-LOC", "I-LOC", "B-LOC"))]
    for name in ("eng.train", "eng.testa", "eng.testb"):
        _write_conll(co / name, iob1)
    assert detect_format(co / "eng.train") == "conll"
    assert ner_labels(co) == CONLL_LABELS
    assert [split_path(co, s).name for s in ("train", "dev", "test")] == \
        ["eng.train", "eng.testa", "eng.testb"]
    assert read_split(co, "test") == [  # IOB1 read as IOB2
        Sentence(("EU", "rejects", "Peter", "Blackburn"), ("B-ORG", "O", "B-PER", "I-PER")),
        Sentence(("Paris", "Berlin", "Lyon"), ("B-LOC", "I-LOC", "B-LOC"))]
    assert ner_sentences.n_classes(LABELS) == 3 and ner_sentences.n_classes(CONLL_LABELS) == 4

    # the renamed layout: train.txt / valid.txt / test.txt
    rn = tmp_path / "renamed"
    rn.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        _write_conll(rn / name, iob1)
    assert [split_path(rn, s).name for s in ("train", "dev", "test")] == \
        ["train.txt", "valid.txt", "test.txt"]

    # errors: a missing directory, a missing split (named, with the file names looked for)
    with pytest.raises(FileNotFoundError, match="task.dir.*not found"):
        split_path(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="task.dir"):
        ner_labels(tmp_path / "nowhere")
    (co / "eng.testa").unlink()
    with pytest.raises(FileNotFoundError, match=r"no dev file .*eng\.testa"):
        split_path(co, "dev")
    with pytest.raises(FileNotFoundError, match="no dev file"):
        read_split(co, "dev")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "train").write_text("\n\n")
    with pytest.raises(ValueError, match="empty NER file"):
        ner_labels(empty)


# ----------------------------------------------------------------------------- 3. HF word pieces

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _pad_and_truncate(path, *, pad_to: int, max_length: int) -> None:
    """Store fixed padding and truncation in a tokenizer.json, as sentence-transformers does."""
    spec = json.loads(path.read_text())
    spec["padding"] = {"strategy": {"Fixed": pad_to}, "direction": "Right",
                       "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                       "pad_token": "[PAD]"}
    spec["truncation"] = {"direction": "Right", "max_length": max_length,
                          "strategy": "LongestFirst", "stride": 0}
    path.write_text(json.dumps(spec))


def _write_wordpiece(directory, words, specials=BERT_SPECIALS, extra=()):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers
    vocab = {t: i for i, t in enumerate([*specials, *extra, *words])}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=specials[1]))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    Path(directory).mkdir(parents=True, exist_ok=True)
    tok.save(str(Path(directory) / "tokenizer.json"))
    return vocab


def test_hf_words(tmp_path):
    from jaxdepth.data.corpus.subwords import HFWords

    v = _write_wordpiece(tmp_path / "bert", ["John", "play", "##ing", "U", ".", "S"])
    w = HFWords(tmp_path / "bert")
    assert (w.pad_id, w.unk_id, w.cls_id, w.sep_id, w.mask_id) == (0, 1, 2, 3, 4)
    assert w.vocab_size == len(v) == 11
    assert w.word_ids(["John", "playing", "U.S.", "xyz"]) == [
        [v["John"]], [v["play"], v["##ing"]], [v["U"], v["."], v["S"], v["."]], [v["[UNK]"]]]
    assert w.word_ids([]) == []

    # RoBERTa-style names: specials <pad> <unk> <s> </s> <mask>, in another order
    rob = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(rob + ["play", "##ing"])}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    (tmp_path / "rob").mkdir()
    tok.save(str(tmp_path / "rob" / "tokenizer.json"))
    r = HFWords(tmp_path / "rob")
    assert (r.unk_id, r.cls_id, r.sep_id, r.pad_id, r.mask_id) == (0, 1, 2, 3, 4)
    assert r.word_ids(["playing"]) == [[5, 6]]

    # errors: no tokenizer.json; no mask token
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="task.init_from.*tokenizer.json"):
        HFWords(tmp_path / "none")
    _write_wordpiece(tmp_path / "nomask", ["a"], specials=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    with pytest.raises(ValueError, match="no mask token"):
        HFWords(tmp_path / "nomask")


# ----------------------------------------------------------------------------- 4. NER end to end

def _ner_cfg(run_dir, task_dir, **sections):
    base = {"task": {"name": "ner", "dir": str(task_dir), "seed": 0},
            "fusion": {"method": "dwatt", "mode": "ft"}}
    for sec, vals in sections.items():
        base[sec] = {**base.get(sec, {}), **vals}
    return _cfg(run_dir, **base)


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory, wikiann_dir):
    from jaxdepth.tasks import train

    run = tmp_path_factory.mktemp("ner") / "run"
    cfg = _ner_cfg(run, wikiann_dir, run={"steps": 30, "eval_every": 10, "save_every": 30},
                   optim={"weight_decay": 0.0})
    summary = train(cfg)
    return run, cfg, summary


def test_ner_run_reports_best_dev_and_test_at_best(ner_run, wikiann_dir):
    run, cfg, summary = ner_run
    evals = _read_jsonl(run / "evals.jsonl")
    assert [r["step"] for r in evals] == [10, 20, 30]
    for r in evals:
        for split in ("dev", "test"):
            p, rc, f = r[f"{split}_precision"], r[f"{split}_recall"], r[f"{split}_f1"]
            assert f == pytest.approx(0.0 if p + rc == 0 else 2 * p * rc / (p + rc), abs=1e-12)
    best = max(evals, key=lambda r: (r["dev_f1"], -r["step"]))
    report = json.loads((run / "analysis" / "ner.json").read_text())
    assert report["best_dev_f1"] == max(r["dev_f1"] for r in evals)
    assert report["best_step"] == best["step"]
    assert report["test_f1_at_best"] == best["test_f1"]
    assert report["curve"] == evals
    assert report["train_sentences"] == 40
    assert report["labels"] == list(LABELS)
    assert (report["method"], report["mode"]) == ("dwatt", "ft")
    assert summary["best_dev_f1"] == report["best_dev_f1"]
    assert summary["dev_f1"] == evals[-1]["dev_f1"] and summary["test_f1"] == evals[-1]["test_f1"]
    # the entities come from 5 names per type: 30 steps at lr 1e-2 learn something
    assert report["best_dev_f1"] > 0.3, evals


@pytest.mark.fake_devices  # eval.py's mesh: data-parallel over gcd(batch, 8 devices)
def test_ner_final_test_f1_recomputed_from_the_saved_model(ner_run, wikiann_dir, capsys):
    from jaxdepth.data.corpus.subwords import SentencePieceWords
    from jaxdepth.data.corpus.tokenizer import Tokenizer
    from jaxdepth.tasks import load_model
    from jaxdepth.tasks.ner import predict_tags

    run, cfg, _ = ner_run
    model, saved, step = load_model(run)
    assert step == 30 and saved.task.name == "ner"
    words = SentencePieceWords(Tokenizer.load(run / "data" / "tokenizer.model"))
    longest = max(len(s.tokens) for split in ("train", "dev", "test")
                  for s in read_wikiann(wikiann_dir / split))
    assert longest <= 16  # max_words 16 caps nothing (the task's own choice is 16 as well)
    encoded = {split: encode_sentences(read_wikiann(wikiann_dir / split), words.word_ids, LABELS,
                                       seq_len=SEQ_LEN, max_words=16,
                                       cls_id=words.cls_id, sep_id=words.sep_id,
                                       pad_id=words.pad_id)
               for split in ("train", "dev", "test")}
    # the 64-piece tokenizer cuts the longest sentences into more than 30 pieces: their tail
    # words do not fit, are reported, and count as predicted O in the F1 below
    report = json.loads((run / "analysis" / "ner.json").read_text())
    assert report["words_not_fitting"] == {k: v[1] for k, v in encoded.items()}
    assert encoded["test"][1] > 0
    test = read_wikiann(wikiann_dir / "test")
    arrays = encoded["test"][0]
    # argmax of the model's logits here (not the task's predict_tags), decoded by hand-tested
    # decode_tags: words past the fitted ones count as O
    logits = model(*(jnp.asarray(arrays[k]) for k in ("tokens", "segments", "mask", "positions")))
    pred = decode_tags(np.argmax(np.asarray(logits), -1), arrays["labels"],
                       [len(s.tokens) for s in test], LABELS)
    assert all(len(p) == len(s.tokens) for p, s in zip(pred, test))
    assert pred == predict_tags(model, arrays, [len(s.tokens) for s in test], LABELS, batch=8)
    got = entity_f1.f1([list(s.tags) for s in test], pred)
    final = _read_jsonl(run / "evals.jsonl")[-1]
    assert final["step"] == 30
    for k in ("precision", "recall", "f1"):
        assert got[k] == pytest.approx(final[f"test_{k}"], abs=1e-12)
    # eval.py on the checkpoint: the same dev/test scores, and the tagged test sentences
    out = _eval_py().evaluate(run, splits="dev,test", out=str(run / "eval_out"))
    for split in ("dev", "test"):
        for k in ("precision", "recall", "f1"):
            assert out[split][k] == pytest.approx(final[f"{split}_{k}"], abs=1e-12)
    tagged = _read_jsonl(run / "eval_out" / "test.jsonl")
    assert [r["prediction"] for r in tagged] == pred
    # an output directory that cannot be made: the result is printed first, then one line
    blocked = run / "eval_out" / "test.jsonl" / "sub"  # under a file, even root cannot
    capsys.readouterr()
    assert _eval_py().main(["--run", str(run), "--out", str(blocked)]) == 2
    printed = capsys.readouterr()
    assert json.loads(printed.out)["test"] == out["test"]
    assert printed.err.strip().splitlines() == [
        f"error: could not write the result to {blocked} (not a directory); it is printed "
        f"above; give --out a writable path to keep it in a file"]


def test_ner_result_on_a_process_that_does_not_write_evals_jsonl(ner_run, tmp_path):
    """Only process 0 writes evals.jsonl; every process keeps the curve of its evaluations
    itself, so another process (on another host) reports the same best-of without reading a
    file it may not see, or see half written."""
    from jaxdepth.tasks import load_model, task_for
    from jaxdepth.models.trial_axis import Models

    run, cfg, _ = ner_run
    elsewhere = tmp_path / "run"  # this process's view of the run: no evals.jsonl in it
    (elsewhere / "data").mkdir(parents=True)
    shutil.copy(run / "data" / "tokenizer.model", elsewhere / "data")
    task = task_for(cfg)
    task.prepare(elsewhere, primary=False, barrier=lambda: None)
    model, _, _ = load_model(run)
    results = [task.evaluate(Models(model), [task], step, None, final=step == 30)[0][0]
               for step in (10, 20, 30)]
    assert not (elsewhere / "evals.jsonl").exists()
    # the same model at every point: the earliest step is the best one
    assert results[-1]["best_step"] == 10
    assert results[-1]["best_dev_f1"] == results[0]["dev_f1"] == results[-1]["dev_f1"]
    assert results[-1]["test_f1_at_best"] == results[0]["test_f1"]


def _eval_py():
    import importlib.util
    spec = importlib.util.spec_from_file_location("eval_py", Path(__file__).parents[2] / "eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_n_shot_trains_on_n_times_c_sentences(ner_run, wikiann_dir, tmp_path):
    from jaxdepth.tasks import task_for
    from jaxdepth.tasks.ner import NERTask

    src_tok = ner_run[0] / "data" / "tokenizer.model"
    train_pool = read_wikiann(wikiann_dir / "train")

    def prepared(name, seed):
        run = tmp_path / name
        (run / "data").mkdir(parents=True)
        shutil.copyfile(src_tok, run / "data" / "tokenizer.model")  # kept: no training on 6
        cfg = _ner_cfg(run, wikiann_dir, task={"n_shot": 2, "seed": seed})
        task = task_for(cfg)
        assert isinstance(task, NERTask)
        return task, task.prepare(run, True, lambda: None)

    (task_a, a), (task_b, b), (_, c) = prepared("a", 5), prepared("b", 5), prepared("c", 6)
    sa = a.sentences["train"]
    assert len(sa) == 6 == len(set(sa))  # N * C = 2 * 3, without replacement
    assert all(s in train_pool for s in sa)
    assert b.sentences["train"] == sa
    assert c.sentences["train"] != sa
    assert len(a.sentences["dev"]) == len(a.sentences["test"]) == 10  # eval splits untouched
    assert a.arrays["train"]["tokens"].shape == (6, SEQ_LEN)
    # the batches drawn for training only ever hold those 6 sentences (and all of them)
    ds = task_a.dataset()
    rows = {tuple(r) for i in range(3) for r in np.asarray(ds[i]["tokens"])}
    assert rows == {tuple(r) for r in a.arrays["train"]["tokens"]}
    np.testing.assert_array_equal(ds[0]["tokens"], task_b.dataset()[0]["tokens"])


# ----------------------------------------------------------------------------- 5. from a pretrained run

@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from jaxdepth.tasks import train

    run = tmp_path_factory.mktemp("pre") / "run"
    train(_cfg(run, model={**TINY, "vocab_size": 128},
               run={"steps": 10, "save_every": 10, "eval_every": 10}))
    return run


def test_ner_fe_from_a_pretrained_run_leaves_the_backbone_alone(pretrained, wikiann_dir,
                                                                tmp_path):
    from jaxdepth.models.backbone import strip_to_backbone
    from jaxdepth.tasks import load_model, train

    run = tmp_path / "ner_fe"
    summary = train(_ner_cfg(run, wikiann_dir, task={"init_from": str(pretrained)},
                             fusion={"method": "dwatt", "mode": "fe"},
                             run={"steps": 6, "save_every": 3}))
    assert summary["init_step"] == 10
    assert (run / "data" / "tokenizer.model").read_bytes() == \
        (pretrained / "data" / "tokenizer.model").read_bytes()
    enc, pre_cfg, _ = load_model(pretrained)
    assert pre_cfg.model.arch == "encoder"
    m3, _, _ = load_model(run, 3)
    m6, _, _ = load_model(run, 6)
    _assert_same_arrays(m6.backbone, strip_to_backbone(enc))
    _assert_same_arrays(m3.backbone, strip_to_backbone(enc))
    # ... while the fusion module and the head did train
    assert not np.array_equal(np.asarray(m3.head.w), np.asarray(m6.head.w))
    assert any(not np.array_equal(x, y) for x, y in zip(_arrays(m3.fusion), _arrays(m6.fusion)))


def test_the_pretrained_step_is_reported_after_a_resume_and_by_every_trial(pretrained,
                                                                          wikiann_dir, tmp_path):
    """summary.json's init_step names task.init_from's checkpoint whether or not this
    invocation read it: a resumed run reads no pretrained weights, and of trials that share
    them only trial 0's task reads them (here each trial's n-shot sample is its own)."""
    from jaxdepth.tasks import train

    def run(where, seeds="", **run_fields):
        return train(_ner_cfg(where, wikiann_dir, task={"init_from": str(pretrained)},
                              fusion={"method": "dwatt", "mode": "fe"},
                              trials={"task_seed": "seed" if seeds else ""},
                              run={"steps": 4, "save_every": 2, "seeds": seeds, **run_fields}))

    assert run(tmp_path / "one", stop_after=2)["done"] is False
    assert run(tmp_path / "one")["init_step"] == 10  # resumed at step 2
    assert run(tmp_path / "two", "0,1", stop_after=2)["done"] is False
    assert [t["init_step"] for t in run(tmp_path / "two", "0,1")["trials"]] == [10, 10]
    assert [t["init_step"] for t in run(tmp_path / "fresh", "0,1")["trials"]] == [10, 10]


def test_mlm_fusion_perplexity_recomputed(pretrained, tmp_path):
    from jaxdepth.tasks import load_model, task_for, train
    from jaxdepth.tasks.mlm import FusionMLMTask, mlm_perplexity

    run = tmp_path / "mlm"
    cfg = _cfg(run, task={"name": "mlm", "init_from": str(pretrained)},
               fusion={"method": "concat", "mode": "fe"},
               run={"steps": 4, "save_every": 4, "eval_batches": 2})
    summary = train(cfg)
    assert summary["task"] == "mlm" and summary["init_step"] == 10
    assert summary["mlm_perplexity"] == pytest.approx(math.exp(summary["mlm_loss"]), rel=1e-12)
    assert summary["mlm_predictions"] > 0
    model, _, step = load_model(run)
    assert step == 4
    task = task_for(cfg)
    assert isinstance(task, FusionMLMTask)
    valid = task.prepare(run, True, lambda: None).valid  # the run's tokenizer, held-out batches
    assert len(valid) == 2
    got = mlm_perplexity(model, valid)
    # the held-out loss recomputed in NumPy from the model's logits at the masked slots
    nll = n = 0.0
    for b in valid:
        logits = np.asarray(model.masked_logits(b["tokens"], b["segments"], b["mask"],
                                                b["mlm_positions"]), np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        picked = np.take_along_axis(logp, b["mlm_ids"][..., None], -1)[..., 0]
        nll -= float((b["mlm_weights"] * picked).sum())
        n += float(b["mlm_weights"].sum())
    assert summary["mlm_loss"] == pytest.approx(nll / n, rel=1e-5)
    assert summary["mlm_perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    by_eval_py = _eval_py().evaluate(run)
    # what eval.py prints is also written, by default to <run>/eval_step<N>.json
    assert json.loads((run / "eval_step4.json").read_text()) == by_eval_py
    for k in ("mlm_loss", "mlm_perplexity", "mlm_predictions"):
        assert by_eval_py[k] == pytest.approx(summary[k], rel=1e-6), k
    for k in ("mlm_loss", "mlm_accuracy", "mlm_perplexity", "mlm_predictions"):
        assert got[k] == pytest.approx(summary[k], rel=1e-6), k
    # an FE run: the backbone is still the pretrained encoder
    enc, _, _ = load_model(pretrained)
    _assert_same_arrays(model.backbone, enc.encoder if hasattr(enc, "encoder") else enc)


# ----------------------------------------------------------------------------- 6. HF backbone

def _bert_arrays(V, D, L, F, P):
    from test_encoder_hf import random_arrays  # the HF-named tensors of a random BERT
    return random_arrays("bert", heads=False, sizes=(V, D, L, F, P))


def _hf_bert(hf, wikiann_dir, P=40):
    """A random BERT of P positions in directory hf, with a WordPiece tokenizer.json of the
    tiny WikiAnn's words; its sizes (V, D, L, F, P)."""
    pytest.importorskip("tokenizers")
    from test_encoder_hf import save_hf_checkpoint
    from test_encoder_hf import hf_config

    words = sorted({w for s in read_wikiann(wikiann_dir / "train") + read_wikiann(
        wikiann_dir / "dev") + read_wikiann(wikiann_dir / "test") for w in s.tokens} - {"UNESCO"})
    vocab = _write_wordpiece(hf, words, extra=["UN", "##ES", "##CO"])  # UNESCO: 3 pieces
    sizes = (len(vocab) + 3, 32, 2, 64, P)
    save_hf_checkpoint(hf, _bert_arrays(*sizes), hf_config("bert", sizes, 2))
    return sizes


def test_ner_on_a_hugging_face_backbone(wikiann_dir, tmp_path):
    from jaxdepth.models.hf_import import load_hf_encoder
    from jaxdepth.tasks import load_model, train

    hf = tmp_path / "bert"
    V, D, L, F, P = _hf_bert(hf, wikiann_dir)

    run = tmp_path / "ner_hf"
    summary = train(_ner_cfg(run, wikiann_dir, task={"init_from": str(hf)},
                             fusion={"method": "base", "mode": "fe"},
                             run={"steps": 3, "save_every": 3}))
    assert summary["init_step"] is None and summary["step"] == 3
    assert not (run / "data" / "tokenizer.model").exists()  # the HF tokenizer.json serves
    model, _, _ = load_model(run)
    ref, _, _ = load_hf_encoder(hf)
    _assert_same_arrays(model.backbone, ref)
    assert model.fusion.NAME == "base" and not jax.tree.leaves(model.fusion)  # adds nothing
    assert model.head.w.shape == (D, len(LABELS))
    report = json.loads((run / "analysis" / "ner.json").read_text())
    assert report["words_not_fitting"] == {"train": 0, "dev": 0, "test": 0}
    assert report["backbone"] == str(hf)


# ----------------------------------------------------------------------------- 7. errors

@pytest.mark.parametrize("source", ["hf", "run"])
def test_seq_len_beyond_the_backbones_positions_is_one_line(source, pretrained, wikiann_dir,
                                                             tmp_path, capsys):
    """data.seq_len longer than the backbone's position table (a 40-position BERT; the
    pretrained run's encoder, 32 positions) is refused before anything is written, naming the
    value, the limit and the source, instead of a traceback from the embedding."""
    from _train_helpers import load_main
    from test_faults import one_line_error

    if source == "hf":
        src, limit = tmp_path / "bert", _hf_bert(tmp_path / "bert", wikiann_dir)[-1]
    else:
        src, limit = pretrained, SEQ_LEN
    run = tmp_path / "run"
    argv = ["--task.name", "ner", "--task.dir", str(wikiann_dir), "--task.init_from", str(src),
            "--fusion.method", "base", "--fusion.mode", "fe", "--data.seq_len", "64",
            "--data.batch_size", "8", "--run.steps", "2", "--run.dir", str(run),
            "--run.progress", "false", "--mesh.data", "1"]
    code = load_main("train.py")(argv)
    err = capsys.readouterr().err
    assert one_line_error(err, code) == (
        f"config error: data.seq_len: 64 is longer than the backbone of task.init_from {src} "
        f"takes ({limit} positions); lower --data.seq_len to {limit} or less")
    assert not run.exists()


def test_init_from_that_is_neither_hf_nor_a_run(wikiann_dir, tmp_path):
    from jaxdepth.tasks import train

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="task.init_from") as e:
        train(_ner_cfg(tmp_path / "run", wikiann_dir, task={"init_from": str(empty)}))
    assert str(empty) in str(e.value)


def test_mlm_data_on_a_hugging_face_vocabulary(tmp_path):
    """MLM with fusion on an HF backbone builds its examples with the tokenizer.json's ids and
    word boundaries: [CLS]/[SEP]/[MASK] of that vocabulary, whole WordPiece words masked (never
    half of "UN ##ES ##CO"), random replacements above the leading specials, and no padding
    leaking into the text even though this tokenizer.json pads and truncates (as
    sentence-transformers' do)."""
    from jaxdepth.data.corpus.mlm_sop import KIND_RANDOM
    from test_encoder_hf import save_hf_checkpoint
    from jaxdepth.tasks import task_for
    from jaxdepth.tasks.mlm import FusionMLMTask

    words = ["alpha", "beta", "gamma", "delta", "went", "home", "the", "a", "to", "."]
    hf = tmp_path / "hf"
    vocab = _write_wordpiece(hf, words, extra=["UN", "##ES", "##CO"])
    _pad_and_truncate(hf / "tokenizer.json", pad_to=40, max_length=6)
    V, D, L, F, P = len(vocab), 16, 1, 32, 40
    save_hf_checkpoint(hf, _bert_arrays(V, D, L, F, P),
                       {"model_type": "bert", "vocab_size": V, "hidden_size": D,
                        "num_attention_heads": 2, "num_hidden_layers": L, "intermediate_size": F,
                        "max_position_embeddings": P, "type_vocab_size": 2, "pad_token_id": 0})
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(words[:6] + ["UNESCO"]) for _ in range(7)) + " ."
                      for _ in range(4)) for _ in range(30)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    cfg = _cfg(tmp_path / "run", task={"name": "mlm", "init_from": str(hf)},
               data={"corpus": str(corpus), "seq_len": 32, "valid_fraction": 0.2,
                     "batch_size": 8, "max_predictions": 6},
               fusion={"method": "concat", "mode": "fe"}, run={"eval_batches": 3})
    task = task_for(cfg)
    assert isinstance(task, FusionMLMTask)
    data = task.prepare(tmp_path / "run", True, lambda: None)
    assert not (tmp_path / "run" / "data" / "tokenizer.model").exists()
    cls, sep, mask_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
    assert data.mlm.first_random_id == max(cls, sep, vocab["[PAD]"], vocab["[UNK]"]) + 1
    un, es, co = vocab["UN"], vocab["##ES"], vocab["##CO"]
    for batch in data.valid:
        for r in range(len(batch["tokens"])):
            n = int(batch["mask"][r].sum())
            orig = batch["tokens"][r].copy()
            pos = batch["mlm_positions"][r][batch["mlm_weights"][r] > 0]
            orig[pos] = batch["mlm_ids"][r][batch["mlm_weights"][r] > 0]
            assert orig[0] == cls and (orig[:n] == sep).sum() == 2 and orig[n - 1] == sep
            assert (orig[1:n] != vocab["[PAD]"]).all()  # no padding inside the text
            assert len(pos) > 0
            kinds = batch["mask_kind"][r]
            got = batch["tokens"][r][pos]
            assert all(t == mask_id or kinds[p] != 1 for t, p in zip(got, pos))
            random_ = [t for t, p in zip(got, pos) if kinds[p] == KIND_RANDOM]
            assert all(t >= data.mlm.first_random_id for t in random_)
            masked = set(pos.tolist())
            for i in range(1, n - 2):  # whole words: UN ##ES ##CO masked together or not at all
                if orig[i] == un and orig[i + 1] == es and orig[i + 2] == co:
                    assert len({i, i + 1, i + 2} & masked) in (0, 3)


def test_unknown_fusion_method(wikiann_dir, tmp_path):
    from jaxdepth.models.fusions import fusion_methods
    from jaxdepth.tasks import task_for
    known = ", ".join(fusion_methods())  # every method of models/fusions/, whatever it holds
    with pytest.raises(ConfigError, match=re.escape(f"fusion.method: must be one of {known}, "
                                                    f"got 'bogus'")):
        task_for(_ner_cfg(tmp_path / "run", wikiann_dir, fusion={"method": "bogus"}))
    with pytest.raises(ConfigError, match="fusion.mode"):
        _ner_cfg(tmp_path / "run", wikiann_dir, fusion={"mode": "frozen"})
    with pytest.raises(ConfigError, match="task.dir"):
        Config.from_dict({"task": {"name": "ner"}})


# ----------------------------------------------------------------------------- 8. real checkpoint

def test_ner_fe_on_the_real_minilm_checkpoint(wikiann_dir, minilm_dir, tmp_path):
    """all-MiniLM-L6-v2 (the minilm_dir fixture): BERT's uncased WordPiece splits words as
    published, and DWAtt FE training on it leaves the 6-layer backbone bit-identical to the
    imported checkpoint."""
    pytest.importorskip("tokenizers")

    from jaxdepth.data.corpus.subwords import HFWords
    from jaxdepth.models.hf_import import load_hf_encoder
    from jaxdepth.tasks import load_model, train

    hf = minilm_dir
    words = HFWords(hf)
    # the WordPiece example of the BERT paper's tokenizer, and the uncased special ids
    pieces = [[words.tok.id_to_token(i) for i in w] for w in words.word_ids(["John", "unaffable"])]
    assert pieces == [["john"], ["una", "##ffa", "##ble"]]
    assert (words.cls_id, words.sep_id, words.pad_id, words.mask_id) == (101, 102, 0, 103)

    run = tmp_path / "ner_minilm"
    train(_ner_cfg(run, wikiann_dir, task={"init_from": str(hf)},
                   fusion={"method": "dwatt", "mode": "fe"}, run={"steps": 2, "save_every": 2}))
    model, _, _ = load_model(run)
    ref, _, _ = load_hf_encoder(hf)
    _assert_same_arrays(model.backbone, ref)


def test_hf_import_tokenizer_neither_pads_nor_truncates(tmp_path):
    """load_hf_encoder's tokenizer ignores the padding / truncation a tokenizer.json stores
    (sentence-transformers' pad and cut every text to a fixed length)."""
    from jaxdepth.models.hf_import import load_tokenizer

    words = ["alpha", "beta", "gamma", "delta", "went", "home"]
    vocab = _write_wordpiece(tmp_path, words)
    _pad_and_truncate(tmp_path / "tokenizer.json", pad_to=40, max_length=3)
    text = "alpha beta gamma delta went home alpha"
    ids = load_tokenizer(tmp_path).encode(text).ids
    assert ids == [vocab[w] for w in text.split()]


def test_a_split_is_parsed_once_while_its_file_is_unchanged(tmp_path):
    from jaxdepth.data.finetune import ner_sentences

    _write_wikiann(tmp_path / "train", _sentences(5, 0))
    first = ner_sentences.read_split(tmp_path, "train")
    hits = ner_sentences._parsed.cache_info().hits
    assert ner_sentences.read_split(tmp_path, "train") == first
    assert ner_sentences._parsed.cache_info().hits == hits + 1
    _write_wikiann(tmp_path / "train", _sentences(7, 1))  # another size: parsed again
    assert ner_sentences.read_split(tmp_path, "train") == _sentences(7, 1)
