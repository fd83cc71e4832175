"""Grammar tasks: determinism, the lexical and structural splits, and hand-checked targets."""
from functools import lru_cache

import pytest

from jaxdepth.data.embedded.grammar import NP, PP, Clause, realize
from jaxdepth.data.finetune.grammar_tasks import (GRAMMAR_TASKS, HELD_OUT_NAME, HELD_OUT_NOUN,
                                                  LEXICAL_TYPES, SPLITS, STRUCTURAL_TYPES_BY_TASK,
                                                  TRAIN_MAX_CP_DEPTH, TRAIN_MAX_PP_DEPTH,
                                                  build_task, make_task, passivization_example,
                                                  semantic_parsing_example)
from jaxdepth.data.finetune.seq2seq_readers import Example

N_TRAIN, N_EVAL = 600, 40


@lru_cache(maxsize=None)
def _built(name):
    return build_task(name, N_TRAIN, N_EVAL, seed=0)


@pytest.fixture(params=GRAMMAR_TASKS)
def built(request):
    return request.param, _built(request.param)


def _has(sentence, lemma, roles):
    return any(l == lemma and r in roles for l, r in zip(sentence.lemmas, sentence.roles))


def test_sizes_and_types(built):
    name, task = built
    assert list(task) == list(SPLITS)
    assert len(task["train"]) == N_TRAIN
    assert len(task["dev"]) == len(task["test"]) == N_EVAL
    for split in ("train", "dev", "test"):
        assert {ex.type for ex, _ in task[split]} == {"in_distribution"}
    assert [ex.type for ex, _ in task["gen_lexical"]] == [
        t for t in LEXICAL_TYPES for _ in range(N_EVAL)]
    assert [ex.type for ex, _ in task["gen_structural"]] == [
        t for t in STRUCTURAL_TYPES_BY_TASK[name] for _ in range(N_EVAL)]
    assert task["dev"][0][0].where == f"grammar:{name}/dev:1"


def test_deterministic_by_seed():
    a = make_task("semantic_parsing", 100, 10, seed=7)
    assert a == make_task("semantic_parsing", 100, 10, seed=7)
    assert a["train"] != make_task("semantic_parsing", 100, 10, seed=8)["train"]


def test_sources_unique_across_splits(built):
    _, task = built
    sources = [ex.source for pairs in task.values() for ex, _ in pairs]
    assert len(sources) == len(set(sources))


def test_examples_match_their_sentences(built):
    name, task = built
    for split, pairs in task.items():
        for ex, s in pairs:
            if name == "semantic_parsing":
                assert (ex.source, ex.target) == (s.text, s.lf)
            else:
                marker = ex.source.split()[-1]
                assert ex.source == f"{s.text} {marker}"
                assert ex == passivization_example(s, marker, ex.type, ex.line, ex.path)
                if split.startswith("gen"):
                    assert marker == "passiv"


def test_passivization_mixes_markers_like_the_published_data():
    task = _built("passivization")
    markers = [ex.source.split()[-1] for ex, _ in task["train"]]
    share = markers.count("passiv") / len(markers)
    assert 0.25 < share < 0.42  # P_PASSIV = 1/3, as 32735/100000 in passiv_en_nps
    # Training passives never have a subject PP; decl copies may (as published).
    assert all(s.tree.subj.pp is None for ex, s in task["train"] if ex.source.endswith("passiv"))
    assert any(s.tree.subj.pp is not None for ex, s in task["train"]
               if ex.source.endswith("decl"))


def test_gen_lexical_shows_held_out_words_in_new_roles_only_there(built):
    _, task = built
    obj_roles, subj_roles = {"obj_noun", "cp_obj_noun"}, {"subj_noun", "cp_subj_noun"}
    for ex, s in task["gen_lexical"]:
        if ex.type == "subj_to_obj_common":
            assert s.tree.obj.head == HELD_OUT_NOUN and s.tree.obj.det is not None
            assert _has(s, HELD_OUT_NOUN, {"obj_noun"})
        else:
            assert s.tree.subj == NP(HELD_OUT_NAME)
            assert _has(s, HELD_OUT_NAME, {"subj_noun"})
    train = [s for _, s in task["train"]]
    assert not any(_has(s, HELD_OUT_NOUN, obj_roles) for s in train)
    assert not any(_has(s, HELD_OUT_NAME, subj_roles) for s in train)
    # The words are in training, in their other role: that is what makes this lexical.
    assert any(_has(s, HELD_OUT_NOUN, subj_roles) for s in train)
    assert any(_has(s, HELD_OUT_NAME, obj_roles) for s in train)


def test_gen_structural_goes_beyond_training(built):
    name, task = built
    train = [s for _, s in task["train"]]
    assert max(s.pp_depth for s in train) == TRAIN_MAX_PP_DEPTH
    assert max(s.cp_depth for s in train) <= TRAIN_MAX_CP_DEPTH
    passives = [s for ex, s in task["train"] if not ex.source.endswith(" decl")]
    assert not any(s.tree.subj.pp for s in passives)
    for ex, s in task["gen_structural"]:
        if ex.type == "pp_recursion":
            assert 2 <= s.pp_depth <= 3
        elif ex.type == "cp_recursion":
            assert 2 <= s.cp_depth <= 3
        else:
            assert ex.type == "obj_pp_to_subj_pp" and s.tree.subj.pp is not None
            assert s.pp_depth <= TRAIN_MAX_PP_DEPTH  # only the attachment site is new


def test_semantic_parsing_targets_by_hand():
    s = realize(Clause("see", "past", NP("cat", "a"),
                             NP("dog", "the", pp=PP("on", NP("mat", "the")))))
    assert semantic_parsing_example(s) == Example(
        "a cat saw the dog on the mat .",
        "see ( agent = cat , theme = * dog ( nmod . on = * mat ) )", "in_distribution")


def test_passivization_targets_by_hand():
    s = realize(Clause("admire", "past", NP("cat", "our", "pl"),
                             NP("owl", "her", adj="old")))
    assert passivization_example(s, "passiv") == Example(
        "our cats admired her old owl . passiv", "her old owl was admired by our cats .",
        "in_distribution")
    assert passivization_example(s, "decl", "x").target == "our cats admired her old owl ."
    intransitive = realize(Clause("sleep", "present", NP("emma")))
    with pytest.raises(ValueError, match="no passive"):
        passivization_example(intransitive, "passiv")
    with pytest.raises(ValueError, match="marker"):
        passivization_example(s, "copy")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown grammar task"):
        make_task("scan", 10, 1, 0)
