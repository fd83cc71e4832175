"""The trials of one run prepare their data once (data/shared_prep.py), and get exactly what
each would have built alone; anything that changes what is built builds anew."""
from pathlib import Path

import numpy as np
import pytest

from jaxdepth.config import DataConfig, TaskConfig
from jaxdepth.data import shared_prep
from jaxdepth.data.corpus import prepare
from jaxdepth.data.corpus.prepare import prepare_lm_data
from jaxdepth.data.finetune import finetune_data
from jaxdepth.data.finetune.finetune_data import prepare_task_data


@pytest.fixture(autouse=True)
def _empty():
    shared_prep._kept.clear()
    yield
    shared_prep._kept.clear()


def _counting(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _files(run: Path) -> dict[str, bytes]:
    return {n: (run / "data" / n).read_bytes()
            for n in ("tokenizer.model", "train.npy", "valid.npy", "valid_docs.txt")}


def test_two_trials_of_one_corpus_build_it_once_and_match_a_build_alone(tmp_path, monkeypatch):
    cfg = DataConfig(grammar_docs=200)
    builds = _counting(monkeypatch, prepare, "train_tokenizer")
    a = prepare_lm_data(cfg, 512, tmp_path / "a", True)
    b = prepare_lm_data(cfg, 512, tmp_path / "b", True)
    assert len(builds) == 1
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    shared_prep._kept.clear()
    alone = prepare_lm_data(cfg, 512, tmp_path / "alone", True)
    assert len(builds) == 2
    assert _files(tmp_path / "alone") == _files(tmp_path / "a")
    np.testing.assert_array_equal(a.train, alone.train)
    np.testing.assert_array_equal(b.valid, alone.valid)


def test_a_changed_corpus_file_is_built_anew(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"the cat number {i} sat on the mat" for i in range(200)))
    cfg = DataConfig(corpus=str(corpus), valid_fraction=0.1)
    first = prepare_lm_data(cfg, 40, tmp_path / "a", True)
    corpus.write_text("\n\n".join(f"a dog number {i} ran in the park" for i in range(200)))
    second = prepare_lm_data(cfg, 40, tmp_path / "b", True)
    assert first.tokenizer.model_proto != second.tokenizer.model_proto
    assert second.tokenizer.decode(second.train[:8].tolist()).startswith("a dog")


def test_trials_of_one_task_tokenize_it_once_into_read_only_arrays(tmp_path, monkeypatch):
    lm = prepare_lm_data(DataConfig(grammar_docs=300), 512, tmp_path / "lm", True)
    task = TaskConfig(name="passivization", n_train=200, n_eval=20, pack=True)
    tok = str(tmp_path / "lm" / "data" / "tokenizer.model")
    generated = _counting(monkeypatch, finetune_data, "make_task")
    packed = _counting(monkeypatch, finetune_data, "pack_features")
    a = prepare_task_data(task, tok, 512, 128, tmp_path / "a", True)
    b = prepare_task_data(task, tok, 512, 128, tmp_path / "b", True)
    assert (len(generated), len(packed)) == (1, 1)
    assert not a.train["inputs"].flags.writeable
    with pytest.raises(ValueError):
        a.train["inputs"][0, 0] = 7
    shared_prep._kept.clear()
    alone = prepare_task_data(task, tok, 512, 128, tmp_path / "c", True)
    assert (len(generated), len(packed)) == (2, 2)
    for k in alone.train:
        np.testing.assert_array_equal(b.train[k], alone.train[k])
    for k in alone.dev:
        np.testing.assert_array_equal(b.dev[k], alone.dev[k])
    assert b.splits == alone.splits and lm.tokenizer.model_proto == b.tokenizer.model_proto
    # another packing seed is other features
    reseeded = prepare_task_data(TaskConfig(name="passivization", n_train=200, n_eval=20,
                                            pack=True, seed=1), tok, 512, 128, tmp_path / "d", True)
    assert len(packed) == 3
    assert reseeded.splits["train"] != alone.splits["train"]
