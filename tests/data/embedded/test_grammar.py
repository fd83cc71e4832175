"""Tests of the embedded grammar: determinism, annotation consistency, knobs, LF, passive."""
import hashlib
import io
from collections import Counter

import pytest

from jaxdepth.data.embedded import grammar as g
from jaxdepth.data.embedded.grammar import NP, PP, Clause, GrammarConfig

SG_NOUNS = set(g.NOUN_PLURAL) | set(g.NAMES)
PL_NOUNS = set(g.NOUN_PLURAL.values())
S3_FORMS = {f[0] for f in g.VERB_FORMS.values()}
BARE_FORMS = set(g.VERB_FORMS)
PAST_FORMS = {f[1] for f in g.VERB_FORMS.values()}
PARTICIPLES = {f[2] for f in g.VERB_FORMS.values()}


@pytest.fixture(scope="module")
def sample():
    return g.generate(5000, seed=7)


def _number(noun):
    assert (noun in SG_NOUNS) != (noun in PL_NOUNS), noun
    return "sg" if noun in SG_NOUNS else "pl"


def _positions(s, role):
    return [i for i, r in enumerate(s.roles) if r == role]


def test_lexicon_forms_are_unambiguous():
    # The consistency tests below read number and tense off the surface forms.
    assert not SG_NOUNS & PL_NOUNS
    assert not PAST_FORMS & (S3_FORMS | BARE_FORMS)
    assert not S3_FORMS & BARE_FORMS
    assert len(g.ROLES) == len(set(g.ROLES))
    assert len(g._LEMMAS) >= 200


def test_deterministic_by_seed():
    a, b = g.generate(300, seed=3), g.generate(300, seed=3)
    assert a == b
    assert [s.text for s in a] != [s.text for s in g.generate(300, seed=4)]
    assert g.generate(40, seed=3) == a[:40]
    assert g.corpus(20, seed=5) == g.corpus(20, seed=5)
    assert g.corpus_texts(20, seed=5) != g.corpus_texts(20, seed=6)


def test_text_hash_is_pinned():
    # Catches any accidental change of the grammar, lexicon or sampling order.
    text = "\n".join(s.text for s in g.generate(100, seed=0))
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == "aedd44f7596c7127835ff4070e0c1d295dd7b6d959ffbf280958f4db74e71730"
    docs = "\n".join(g.corpus_texts(50, seed=0))
    assert hashlib.sha256(docs.encode()).hexdigest() == (
        "dfa9e8125c757d568f10f70bf42e98d8a731b9e9084133e8912b196aeedcf0e4")


def test_annotation_shapes(sample):
    for s in sample:
        assert len(s.words) == len(s.roles) == len(s.lemmas)
        assert set(s.roles) <= set(g.ROLES)
        assert s.words[-1] == "." and s.roles[-1] == "punct" and s.roles.count("punct") == 1
        assert s.text == " ".join(s.words) and s.text == s.text.lower()
        assert s.roles.count("verb") == 1 and s.roles.count("subj_noun") == 1
        assert s.voice == "active"
    seen = {r for s in sample for r in s.roles}
    passive_only = {"aux", "by"} | {r for r in g.ROLES if r.startswith("agent_")}
    assert seen == set(g.ROLES) - passive_only  # every active role is reachable


def test_subject_verb_agreement(sample):
    n_present = 0
    for s in sample:
        for i, role in enumerate(s.roles):
            if not role.endswith("verb"):
                continue
            prefix = role[: -len("verb")]
            # The verb's subject head is the nearest preceding noun of its clause's subject.
            subj = max(j for j in _positions(s, prefix + "subj_noun") if j < i)
            verb, lemma = s.words[i], s.lemmas[i]
            if verb in PAST_FORMS:
                assert verb == g.VERB_FORMS[lemma][1]
                continue
            n_present += 1
            expected = g.VERB_FORMS[lemma][0] if _number(s.words[subj]) == "sg" else lemma
            assert verb == expected, s.text
    assert n_present > 1000


def test_determiner_agreement(sample):
    for s in sample:
        for i, role in enumerate(s.roles):
            if not role.endswith("_det"):
                continue
            j = s.roles.index(role[: -len("det")] + "noun", i)
            det = s.lemmas[i]
            assert _number(s.words[j]) in g.DETERMINERS[det][0], s.text
            # a/an follows the next word's first letter
            if det == "a":
                vowel = s.words[i + 1][0] in "aeiou"
                assert s.words[i] == ("an" if vowel else "a"), s.text
            else:
                assert s.words[i] == det


def test_features_match_words(sample):
    kinds = Counter()
    for s in sample:
        subj = s.words[s.roles.index("subj_noun")]
        assert s.subj_number == _number(subj)
        objs = _positions(s, "obj_noun")
        assert s.obj_number == (_number(s.words[objs[0]]) if objs else None)
        verb = s.words[s.roles.index("verb")]
        assert s.tense == ("past" if verb in PAST_FORMS else "present")
        assert s.cp_depth == s.roles.count("comp") + s.roles.count("cp_comp")
        kinds[s.tense, s.subj_number, s.obj_number] += 1
    assert len(kinds) == 2 * 2 * 3  # every feature combination occurs


def test_lf_hand_examples():
    s = g.realize(Clause("see", "past", NP("cat", "a"),
                               NP("dog", "the", pp=PP("on", NP("mat", "the")))))
    assert s.text == "a cat saw the dog on the mat ."
    assert s.lf == "see ( agent = cat , theme = * dog ( nmod . on = * mat ) )"
    assert s.roles == ("subj_det", "subj_noun", "verb", "obj_det", "obj_noun", "obj_pp_prep",
                       "obj_pp_det", "obj_pp_noun", "punct")
    assert (s.tense, s.subj_number, s.obj_number, s.pp_depth, s.cp_depth) == (
        "past", "sg", "sg", 1, 0)

    s = g.realize(Clause("say", "present", NP("emma"),
                               ccomp=Clause("fall", "past", NP("apple", "a", adj="old"))))
    assert s.text == "emma says that an old apple fell ."
    assert s.lf == "say ( agent = emma , ccomp = fall ( theme = apple ( amod = old ) ) )"
    assert s.roles == ("subj_noun", "verb", "comp", "cp_subj_det", "cp_subj_adj",
                       "cp_subj_noun", "cp_verb", "punct")
    assert s.lemmas == ("emma", "say", "that", "a", "old", "apple", "fall", ".")

    s = g.realize(Clause("smile", "present", NP(
        "cat", "these", "pl", pp=PP("near", NP("box", "my", "pl", pp=PP("in", NP("car", "a")))))))
    assert s.text == "these cats near my boxes in a car smile ."
    assert s.lf == "smile ( agent = * cat ( nmod . near = * box ( nmod . in = car ) ) )"
    assert s.pp_depth == 2 and s.obj_number is None


def test_passive_hand_examples():
    active = g.realize(Clause("see", "past", NP("cat", "a"),
                                    NP("dog", "the", pp=PP("on", NP("mat", "the")))))
    p = g.to_passive(active)
    assert p.text == "the dog on the mat was seen by a cat ."
    assert p.roles == ("subj_det", "subj_noun", "subj_pp_prep", "subj_pp_det", "subj_pp_noun",
                       "aux", "verb", "by", "agent_det", "agent_noun", "punct")
    assert p.lf == active.lf
    assert (p.voice, p.tense, p.subj_number, p.obj_number) == ("passive", "past", "sg", None)
    assert g.to_passive(p) is p

    p = g.to_passive(g.realize(Clause("like", "present", NP("cat", "the", "pl"),
                                            NP("emma"))))
    assert p.text == "emma is liked by the cats ."
    p = g.to_passive(g.realize(Clause("eat", "present", NP("emma"),
                                            NP("apple", "some", "pl"))))
    assert p.text == "some apples are eaten by emma ."
    assert p.subj_number == "pl" and p.tense == "present"

    assert g.to_passive(g.realize(Clause("sleep", "past", NP("emma")))) is None
    cp = Clause("say", "past", NP("emma"), ccomp=Clause("see", "past", NP("liam"), NP("emma")))
    assert g.to_passive(g.realize(cp)) is None


def test_passive_of_generated(sample):
    n = 0
    for s in sample:
        p = g.to_passive(s)
        if "obj_noun" not in s.roles:
            assert p is None
            continue
        n += 1
        assert p.lf == s.lf and p.tense == s.tense
        assert p.subj_number == s.obj_number and p.obj_number is None
        assert len(p.words) == len(s.words) + 2 and set(p.roles) <= set(g.ROLES)
        aux = p.words[p.roles.index("aux")]
        assert aux == {("past", "sg"): "was", ("past", "pl"): "were",
                       ("present", "sg"): "is", ("present", "pl"): "are"}[p.tense, p.subj_number]
        assert p.words[p.roles.index("verb")] in PARTICIPLES
        # Same content words, moved: the old object's tokens now open the sentence.
        obj = [w for w, r in zip(s.words, s.roles) if r.startswith("obj_")]
        assert list(p.words[: len(obj)]) == obj
        assert [r.replace("obj_", "subj_", 1) for r in s.roles if r.startswith("obj_")] == \
            list(p.roles[: len(obj)])
    assert n > 1000


def test_pp_knobs():
    def pp_roles(sents):
        return {r for s in sents for r in s.roles if "_pp_" in r}

    assert pp_roles(g.generate(3000, 0, GrammarConfig(max_pp_depth=0))) == set()
    no_subj = g.generate(3000, 0, GrammarConfig(subj_pp=False))
    assert {r for r in pp_roles(no_subj) if "subj_pp" in r} == set()
    assert any(r.startswith("obj_pp") for r in pp_roles(no_subj))
    default = g.generate(3000, 0)
    assert any("subj_pp" in r for r in pp_roles(default))
    assert max(s.pp_depth for s in default) == 2
    one = g.generate(3000, 0, GrammarConfig(max_pp_depth=1, p_pp=0.9))
    assert max(s.pp_depth for s in one) == 1
    deep = g.generate(500, 0, GrammarConfig(max_pp_depth=4, p_pp=0.9))
    assert max(s.pp_depth for s in deep) == 4


def test_cp_knob():
    assert all(s.cp_depth == 0 and not any(r.startswith("cp_") for r in s.roles)
               for s in g.generate(3000, 0, GrammarConfig(max_cp_depth=0)))
    assert max(s.cp_depth for s in g.generate(3000, 0, GrammarConfig(max_cp_depth=1))) == 1
    assert max(s.cp_depth for s in g.generate(3000, 0)) == 2
    deep = g.generate(300, 0, GrammarConfig(max_cp_depth=5, p_cp=0.95))
    assert max(s.cp_depth for s in deep) == 5


def test_forbid_is_respected():
    forbid = {("dog", "obj_noun"), ("cat", "subj_noun"), ("see", "verb"),
              ("the", "cp_subj_det"), ("mat", "obj_pp_noun")}
    sents = g.generate(6000, 1, GrammarConfig(forbid=frozenset(forbid), p_pp=0.5))
    at = Counter((lemma, r) for s in sents for lemma, r in zip(s.lemmas, s.roles))
    for lemma, role in forbid:
        assert at[lemma, role] == 0
        if not role.startswith("cp_"):  # a main-clause role also covers its cp_ twin
            assert at[lemma, "cp_" + role] == 0
    # The words are still used elsewhere, and a cp_ role leaves the main clause alone.
    assert at["dog", "subj_noun"] > 0 and at["cat", "obj_noun"] > 0 and at["see", "cp_verb"] == 0
    assert at["the", "subj_det"] > 0 and at["mat", "subj_pp_noun"] > 0
    assert at["see", "verb"] == 0
    # Re-mentions in documents go through the same filter.
    docs = g.corpus(500, 1, cfg=GrammarConfig(forbid=frozenset(forbid)))
    assert not any((lemma, r) in forbid for d in docs for s in d
                   for lemma, r in zip(s.lemmas, s.roles))


def test_forbid_validation():
    with pytest.raises(ValueError, match="unknown lemma"):
        GrammarConfig(forbid=frozenset({("cats", "obj_noun")}))
    with pytest.raises(ValueError, match="cannot be forbidden"):
        GrammarConfig(forbid=frozenset({("cat", "agent_noun")}))
    with pytest.raises(ValueError, match="p_pp"):
        GrammarConfig(p_pp=1.5)
    everything = frozenset((v, "verb") for v in g.TRANSITIVE_VERBS)
    with pytest.raises(ValueError, match="no transitive lemma"):
        g.generate(50, 0, GrammarConfig(forbid=everything))


def test_corpus_documents():
    docs = g.corpus(300, seed=2, sents_per_doc=(3, 8))
    lengths = Counter(len(d) for d in docs)
    assert set(lengths) == set(range(3, 9))
    texts = g.corpus_texts(300, seed=2)
    assert texts == [" ".join(s.text for s in d) for d in docs]
    # Entities are introduced indefinitely and re-mentioned definitely, so "a X" then
    # "the X" is far more common than the reverse: the signal sentence-order tasks need.
    def heads(s, det):
        return {s.lemmas[s.roles.index(r[: -len("det")] + "noun", i)]
                for i, r in enumerate(s.roles) if r.endswith("_det") and s.lemmas[i] == det}

    forward = backward = 0
    for d in docs:
        for i, s in enumerate(d):
            for later in d[i + 1:]:
                forward += len(heads(s, "a") & heads(later, "the"))
                backward += len(heads(s, "the") & heads(later, "a"))
    assert forward > 100 and forward > 10 * backward


class _CountingRNG:
    """A numpy Generator that counts its calls to random()."""

    def __init__(self, rng):
        self.rng, self.calls, self.values = rng, 0, 0

    def random(self, size):
        self.calls += 1
        self.values += size
        return self.rng.random(size)


def _counted_generate(monkeypatch, n: int, seed: int):
    """generate(n, seed) with its generator's uniform draws and numpy calls counted, from a
    cold pool cache: (sentences, draws, numpy calls, numpy values, pool cache info)."""
    made = []

    class Counting(g._Generator):
        def __init__(self, cfg, seed):
            super().__init__(cfg, seed)
            self._rng = _CountingRNG(self._rng)
            self.draws = 0
            made.append(self)

        def u(self):
            self.draws += 1
            return super().u()

    g._pool.cache_clear()
    with monkeypatch.context() as m:
        m.setattr(g, "_Generator", Counting)
        out = g.generate(n, seed=seed)
    (gen,) = made
    return out, gen.draws, gen._rng.calls, gen._rng.values, g._pool.cache_info()


def test_generation_cost_is_linear_with_block_draws_and_cached_pools(monkeypatch):
    # What keeps generation fast (20,000 sentences in well under a second), counted instead of
    # timed (the benchmark is benchmarks/bench_grammar.py): a bounded number of uniform draws
    # per sentence, fetched from numpy in large blocks (one numpy call per draw dominated the
    # time), and each lemma pool built once per (forbid, role, kind), whatever n is.
    small, draws_s, calls_s, values_s, info_s = _counted_generate(monkeypatch, 2_000, 11)
    big, draws_b, calls_b, values_b, info_b = _counted_generate(monkeypatch, 20_000, 11)
    assert big == g.generate(20_000, seed=11) and big[:2_000] == small  # counting changes nothing

    # linear: the same sentences cost the same draws, about 17 per sentence
    assert 5 * 2_000 <= draws_s <= 40 * 2_000
    assert 9 * draws_s <= draws_b <= 11 * draws_s
    # block draws: one numpy call per >= 1024 uniforms, and no block fetched before it is needed
    assert calls_b * 1024 <= values_b < draws_b + values_b / calls_b
    assert calls_s * 1024 <= values_s < draws_s + values_s / calls_s
    # cached pools: as many pools built for 20,000 sentences as for 2,000, a few dozen at most;
    # every other lookup is a cache hit
    assert info_b.misses == info_s.misses <= len(g.ROLES) * len(g._KINDS)
    assert info_b.hits >= 9 * info_s.hits
    g.generate(20_000, seed=12)  # a warm cache builds no pool again
    assert g._pool.cache_info().misses == info_b.misses


def test_sentencepiece_vocab_512_is_feasible():
    spm = pytest.importorskip("sentencepiece")
    texts = g.corpus_texts(2000, seed=0)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=512,
        model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    assert sp.get_piece_size() == 512
    assert sp.decode(sp.encode(texts[0])) == texts[0]
