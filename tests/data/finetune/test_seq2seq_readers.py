"""Benchmark readers: hand-made fixtures in each published format, malformed input, and the
real files of the shared data directory (the shared_data fixture) checked against the counts
and examples of docs/datasets.md."""
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from jaxdepth.data.finetune.seq2seq_readers import (PASSIVIZATION_GEN_TYPE, STRUCTURAL_TYPES,
                                                    Example, is_generalization_type, load_task,
                                                    read_cogs, read_geoquery, read_passivization,
                                                    split_validation)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "tasks"


# ---------------------------------------------------------------------------------------
# Fixtures (tiny, hand-made)


def test_cogs_fixture_keeps_every_line_as_published():
    train = read_cogs(FIXTURES / "cogs", "train")
    assert [e.type for e in train] == ["in_distribution", "primitive", "primitive",
                                       "exposure_example_obj_common"]
    assert train[1] == Example("Emma", "Emma", "primitive", 2, str(FIXTURES / "cogs/train.tsv"))
    assert train[3].source == "The owl found a TV ."
    assert train[3].target.endswith("tv ( x _ 4 )")  # lower-case in the LF, as in COGS
    gen = read_cogs(FIXTURES / "cogs", "gen")
    assert [e.type for e in gen] == ["obj_pp_to_subj_pp", "prim_to_subj_proper"]
    assert read_cogs(FIXTURES / "cogs_vf", "gen")[0].target == (
        "see ( agent = frog ( nmod . on = mat ) , theme = Emma )")


def test_geoquery_fixture_keeps_anonymised_entities():
    train = read_geoquery(FIXTURES / "geoquery", "train")
    assert len(train) == 4 and all(e.type == "in_distribution" for e in train)
    assert train[2].source == "which cities in m0 are bigger than m1"
    assert "larger ( m1 )" in train[2].target
    assert read_geoquery(FIXTURES / "geoquery", "test")[0].line == 1


def test_passivization_fixture_keeps_the_marker_in_the_source():
    train = read_passivization(FIXTURES / "passivization_en", "train")
    assert [e.type for e in train] == ["decl", "passiv", "passiv"]
    assert train[1].source == "our owls saw your lamp beside some yak . passiv"
    assert train[1].target == "your lamp beside some yak was seen by our owls ."
    gen = read_passivization(FIXTURES / "passivization_en", "gen")
    assert gen[0].source.endswith(" passiv") and gen[0].type == PASSIVIZATION_GEN_TYPE
    assert PASSIVIZATION_GEN_TYPE in STRUCTURAL_TYPES


def test_load_task_dispatches():
    assert load_task("cogs_vf", FIXTURES / "cogs_vf", "train")[0].target == (
        "see ( agent = frog , theme = * ball )")
    assert len(load_task("passivization", FIXTURES / "passivization_en", "dev")) == 1
    with pytest.raises(ValueError, match="unknown task"):
        load_task("scan", FIXTURES, "train")


@pytest.mark.parametrize("reader, split", [
    (read_cogs, "validation"), (read_geoquery, "dev"), (read_passivization, "train_100"),
])
def test_unknown_split_is_an_error(reader, split):
    with pytest.raises(ValueError, match=f"split {split!r}"):
        reader(FIXTURES, split)


def test_missing_files():
    with pytest.raises(FileNotFoundError, match="train_100 is optional"):
        read_cogs(FIXTURES / "cogs", "train_100")
    with pytest.raises(FileNotFoundError, match="data file not found"):
        read_geoquery(FIXTURES / "no_such_dir", "train")


def test_train_100_is_read_when_present(tmp_path):
    (tmp_path / "train_100.tsv").write_text("Emma\tEmma\tprimitive\n")
    assert read_cogs(tmp_path, "train_100")[0].source == "Emma"


@pytest.mark.parametrize("content, line, message", [
    ("a b .\tlf\n", 1, "expected 3 tab-separated columns, got 2"),
    ("a .\tlf\tin_distribution\nb .\tlf\tx\textra\n", 2, "got 4"),
    ("a .\tlf\tin_distribution\n \tlf\tin_distribution\n", 2, "empty source"),
    ("a .\t \tin_distribution\n", 1, "empty target"),
    ("a .\tlf\t\n", 1, "empty type"),
    ("a .\tlf\tin_distribution\n\nb .\tlf\tin_distribution\n", 2, "blank line"),
])
def test_malformed_cogs_names_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "train.tsv"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"train.tsv:{line}: .*{message}"):
        read_cogs(tmp_path, "train")


def test_trailing_blank_lines_and_crlf_are_tolerated(tmp_path):
    (tmp_path / "test.tsv").write_bytes(b"what is m0\tanswer ( m0 )\r\n\n\n")
    assert read_geoquery(tmp_path, "test") == [
        Example("what is m0", "answer ( m0 )", "in_distribution", 1, str(tmp_path / "test.tsv"))]


@pytest.mark.parametrize("split, content, message", [
    ("train", "a cat saw me . copy\ta cat saw me .\n", "task marker"),
    ("train", "passiv\tx\n", "no sentence"),
    ("gen", "a cat saw me . decl\ta cat saw me .\n", "gen lines must be 'passiv'"),
    ("dev", "a cat saw me . decl\n", "expected 2"),
])
def test_malformed_passivization(tmp_path, split, content, message):
    (tmp_path / f"passiv_en_nps.{split}").write_text(content)
    with pytest.raises(ValueError, match=f"passiv_en_nps.{split}:1: .*{message}"):
        read_passivization(tmp_path, split)


def test_split_validation_is_deterministic_and_disjoint():
    examples = [Example(f"q{i}", f"a{i}", "in_distribution", i + 1, "x") for i in range(50)]
    train, val = split_validation(examples, 0.2, seed=3)
    assert len(val) == 10 and len(train) == 40
    assert sorted(train + val, key=lambda e: e.line) == examples
    assert [e.line for e in val] == sorted(e.line for e in val)  # original order kept
    assert split_validation(examples, 0.2, seed=3) == (train, val)
    assert split_validation(examples, 0.2, seed=4)[1] != val
    assert len(split_validation(examples[:3], 0.01, seed=0)[1]) == 1
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError):
            split_validation(examples, bad, seed=0)


def test_generalization_type_classification():
    assert not is_generalization_type("in_distribution")
    assert not is_generalization_type("passiv")
    assert not is_generalization_type("primitive")
    assert not is_generalization_type("exposure_example_subj_common")
    assert is_generalization_type("subj_to_obj_common")
    assert is_generalization_type("pp_recursion")


# ---------------------------------------------------------------------------------------
# The real files (skipped when the shared data directory is absent)


@lru_cache(maxsize=None)
def _load(task: str, directory: str, split: str) -> tuple[Example, ...]:
    # Each file is read once per session however many tests use it.
    return tuple(load_task(task, directory, split))


def test_real_cogs_counts_and_quirks(shared_data):
    d = str(shared_data / "cogs")
    train, gen = _load("cogs", d, "train"), _load("cogs", d, "gen")
    assert len(train) == 24155
    types = Counter(e.type for e in train)
    assert types["in_distribution"] == 24000 and types["primitive"] == 143
    exposure = [t for t in types if t.startswith("exposure_example_")]
    assert len(exposure) == 12 and all(types[t] == 1 for t in exposure)
    assert sum(types.values()) == 24000 + 143 + 12
    gen_types = Counter(e.type for e in gen)
    assert len(gen) == 21000 and len(gen_types) == 21 and set(gen_types.values()) == {1000}
    assert STRUCTURAL_TYPES <= set(gen_types)
    for split in ("dev", "test"):
        examples = _load("cogs", d, split)
        assert len(examples) == 3000 and {e.type for e in examples} == {"in_distribution"}
    paula = Example("Paula", "Paula", "primitive", 5178, str(shared_data / "cogs/train.tsv"))
    assert paula in train
    # "TV" in the sentence, "tv" in the LF; the past tense "lended".
    for examples, tv, lended in ((train, 16, 1155), (gen, 72, 526)):
        assert sum("TV" in e.source.split() and "tv" in e.target.split() for e in examples) == tv
        assert sum("lended" in e.source.split() for e in examples) == lended
    assert gen[0] == Example(
        "Paula painted a cake in a closet .",
        "paint . agent ( x _ 1 , Paula ) AND paint . theme ( x _ 1 , x _ 3 ) AND cake ( x _ 3 ) "
        "AND cake . nmod . in ( x _ 3 , x _ 6 ) AND closet ( x _ 6 )",
        "prim_to_subj_proper", 1, str(shared_data / "cogs/gen.tsv"))


def test_real_cogs_vf_lines_up_with_cogs(shared_data):
    vf, cogs = _load("cogs_vf", str(shared_data / "cogs_vf"), "train"), _load(
        "cogs", str(shared_data / "cogs"), "train")
    assert len(vf) == 24155
    assert [(e.source, e.type) for e in vf] == [(e.source, e.type) for e in cogs]
    assert vf[918].line == 919 and (vf[918].source, vf[918].target, vf[918].type) == (
        "A hedgehog ate the cake on the bed .",
        "eat ( agent = hedgehog , theme = * cake ( nmod . on = * bed ) )",
        "exposure_example_subj_common")
    gen = _load("cogs_vf", str(shared_data / "cogs_vf"), "gen")
    assert len(gen) == 21000 and len({e.type for e in gen}) == 21


def test_real_geoquery(shared_data):
    d = str(shared_data / "geoquery")
    train, test = _load("geoquery", d, "train"), _load("geoquery", d, "test")
    assert (len(train), len(test)) == (600, 280)
    assert test[278].source == "which states have cities named m0"
    assert test[278].target == (
        "answer ( intersection ( state , loc_1 ( intersection ( city , m0 ) ) ) )")
    assert sum("m1" in e.source.split() for e in train + test) == 6
    assert all("m1" in e.target.split() for e in train + test if "m1" in e.source.split())
    with pytest.raises(ValueError, match="split 'dev'"):
        read_geoquery(d, "dev")
    fit, val = split_validation(list(train), 0.1, seed=0)
    assert (len(fit), len(val)) == (540, 60)


def test_real_passivization(shared_data):
    d = str(shared_data / "passivization_en")
    expected = {"train": (67265, 32735), "dev": (665, 335), "test": (6693, 3307)}
    for split, (decl, passiv) in expected.items():
        types = Counter(e.type for e in _load("passivization", d, split))
        assert types == {"decl": decl, "passiv": passiv}
    train = _load("passivization", d, "train")
    assert train[0].source == "our vultures admired her walrus above some zebra . passiv"
    assert train[0].target == "her walrus above some zebra was admired by our vultures ."
    assert all(e.source == e.target + " decl" for e in train if e.type == "decl")
    gen = _load("passivization", d, "gen")
    assert len(gen) == 10000 and {e.type for e in gen} == {PASSIVIZATION_GEN_TYPE}
    assert all(e.source.endswith(" passiv") for e in gen)
