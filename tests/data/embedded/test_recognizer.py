"""The embedded grammar's recognizer (data/embedded/recognizer.py) against its generator
(data/embedded/grammar.py): everything the generator writes is accepted, hand-made violations of each
rule are refused, and every prefix of a sentence is a viable prefix."""
from __future__ import annotations

import pytest

from jaxdepth.data.embedded import grammar as g
from jaxdepth.data.embedded.recognizer import is_grammatical

DEEP = g.GrammarConfig(max_pp_depth=3, max_cp_depth=3, p_pp=0.5, p_cp=0.4)


def is_sentence(words, passive: bool = False) -> bool:
    """Whether `words` (ending with '.') is one sentence of the grammar."""
    return bool(words) and words[-1] == "." and "." not in words[:-1] and \
        is_grammatical(list(words), passive=passive)



@pytest.fixture(scope="module")
def sentences():
    return g.generate(3000, seed=0) + g.generate(1500, seed=1, cfg=DEEP)


def test_everything_the_generator_writes_is_accepted(sentences):
    assert [s.text for s in sentences if not is_sentence(s.words)] == []
    docs = g.corpus_texts(200, seed=5)
    assert all(is_grammatical(d) for d in docs)


def test_passives_only_when_asked(sentences):
    passives = [p for p in map(g.to_passive, sentences) if p is not None]
    assert len(passives) > 1000
    assert all(is_sentence(p.words, passive=True) for p in passives)
    assert not any(is_sentence(p.words) for p in passives)


@pytest.mark.parametrize("text", [
    "the cats sees the dog .",          # subject-verb agreement
    "a cats slept .",                    # determiner number
    "several cat slept .",
    "a apple fell .",                    # a / an
    "an dog slept .",
    "the rock saw the dog .",            # a transitive verb wants an animate subject
    "the cat on the dog slept .",        # a PP's noun is inanimate
    "the emma slept .",                  # names take no determiner
    "the cat saw .",                     # a transitive verb needs its object
    "the cat slept the dog .",           # an intransitive one takes none
    "emma said the dog slept .",         # a clausal verb needs "that"
    "the big big cat slept .",           # one adjective at most
    "the cat slept",                     # no final period
    ".",
    "the dog was seen by emma .",        # passive, not allowed by default
])
def test_violations_are_refused(text):
    assert not is_grammatical(text)


def test_hand_made_sentences():
    for text in ("emma said that the cats near a rock on the table slept .",
                 "an old dog sees some apples .", "the mice like liam .",
                 "noah thinks that ava knows that the dog slept ."):
        assert is_grammatical(text), text
    assert is_grammatical("the dog was seen by emma .", passive=True)
    assert not is_grammatical("the dog were seen by emma .", passive=True)
    assert not is_grammatical("the dog was seen by the rock .", passive=True)


def test_every_prefix_of_a_sentence_is_viable(sentences):
    for s in sentences[:400]:
        for k in range(1, len(s.words)):
            assert is_grammatical(s.words[:k], prefix=True), s.words[:k]
        assert not is_grammatical(s.words[:-1])  # unfinished is not grammatical


def test_prefix_mode_refuses_what_cannot_be_completed():
    assert is_grammatical("the dog slept . a cat saw", prefix=True)
    assert is_grammatical("the dog slept . a cat sa", prefix=True)  # cut inside a word
    assert not is_grammatical("the dog slept . a every clever big built the cray", prefix=True)
    assert not is_grammatical("the dog slept . the the", prefix=True)
    assert not is_grammatical("the dogs sleeps . the", prefix=True)  # a bad whole sentence


def test_grammatical_share_reads_eos_as_the_end(monkeypatch):
    """A continuation that generated EOS must end a sentence; one cut by the token limit may
    stop inside one (tasks/lm.py:grammatical_share)."""
    from jaxdepth.data.corpus.tokenizer import EOS_ID, train_tokenizer
    from jaxdepth.tasks import lm

    tok = train_tokenizer(g.corpus_texts(300, seed=1), 512)
    cases = [("sees the dog . emma", False),  # cut by the limit: a viable prefix, accepted
             ("sees .", True),                 # ended: "sees" needs an object, refused
             ("slept .", True),                # ended after a sentence, accepted
             ("slept . the the", False)]       # cut, and no sentence goes on "the the"
    pairs = [(tok.encode("the cat"), tok.encode(c) + ([EOS_ID] if ended else []))
             for c, ended in cases]
    monkeypatch.setattr(lm, "_continue", lambda model, tok_, docs, n, key: pairs)
    assert lm.grammatical_share(None, tok, ["unused"], 8) == 0.5
