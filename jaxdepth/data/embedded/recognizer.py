"""Does a word sequence derive from the embedded grammar (data/embedded/grammar.py)? A
recognizer, used to score what a language model trained on the grammar corpus writes.

The rules, with the generator's agreement and selection (its depth limits are generation
knobs, not rules, so recursion is unbounded here):

    S      -> CLAUSE "."
    CLAUSE -> NP_a  V_trans  NP_any              (active)
            | NP_a  V_clausal "that" CLAUSE
            | NP_a  V_unerg
            | NP_any V_unacc
            | NP_any be V_participle "by" NP_a   (passive, only with passive=True)
    NP_a   -> NAME | DET (ADJ) NOUN_animate (PP)   NP_any: any noun or a name
    PP     -> PREP DET (ADJ) NOUN_inanimate (PP)

A determiner agrees in number with its noun, the verb with its subject ("sees" / "see" in
the present, one past form), "be" with the passive subject and the tense; "a" is "an" before
a vowel. A text is grammatical when it is a sequence of such sentences; ``prefix=True`` also
accepts a text whose last sentence is unfinished but can still be completed (a sample cut off
by a token limit, possibly inside its last word).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

from . import grammar as g

# A parse that ran out of words where the grammar still expected some: a viable prefix.
_MORE = -1

_SG = {n: n for n in g.NOUN_PLURAL}
_PL = {p: n for n, p in g.NOUN_PLURAL.items()}
_ANIMATE = frozenset(g.ANIMATE_NOUNS)
_INANIMATE = frozenset(g.INANIMATE_NOUNS)
_NAMES = frozenset(g.NAMES)
_PREPS = frozenset(g.PREPOSITIONS)
_ADJS = frozenset(g.ADJECTIVES)
_BE = {form: key for key, form in g.BE_FORMS.items()}  # "was" -> ("past", "sg")


def _verb_forms(lemmas: Sequence[str]) -> dict[str, set[tuple[str, str]]]:
    """word -> {(tense, number the subject must have, or 'any')} for verbs of one frame."""
    out: dict[str, set] = {}
    for lemma in lemmas:
        s3, past, _ = g.VERB_FORMS[lemma]
        out.setdefault(s3, set()).add(("present", "sg"))
        out.setdefault(lemma, set()).add(("present", "pl"))
        out.setdefault(past, set()).add(("past", "any"))
    return out


_TRANS = _verb_forms(g.TRANSITIVE_VERBS)
_CLAUSAL = _verb_forms(g.CLAUSAL_VERBS)
_UNERG = _verb_forms(g.UNERGATIVE_VERBS)
_UNACC = _verb_forms(g.UNACCUSATIVE_VERBS)
_PARTICIPLES = frozenset(g.VERB_FORMS[v][2] for v in g.TRANSITIVE_VERBS)
_WORDS = tuple(sorted({*_SG, *_PL, *_NAMES, *_PREPS, *_ADJS, *g.DETERMINERS, "an", "that", "by",
                       *_BE, *_PARTICIPLES, *(w for t in (_TRANS, _CLAUSAL, _UNERG, _UNACC)
                                              for w in t)}))


def _agrees(forms: set[tuple[str, str]], number: str) -> bool:
    return any(n in ("any", number) for _, n in forms)


class _Parser:
    def __init__(self, words: Sequence[str], passive: bool):
        self.w, self.n, self.passive = tuple(words), len(words), passive

    def np(self, i: int, kind: str) -> Iterator[tuple[int, str]]:
        """(end, number) of every NP of `kind` ('animate', 'any', 'inanimate') at i."""
        if i == self.n:
            yield _MORE, ""
            return
        word = self.w[i]
        if word in _NAMES and kind != "inanimate":
            yield i + 1, "sg"
        det = g.DETERMINERS.get("a" if word == "an" else word)
        if det is None:
            return
        j = i + 1
        if j == self.n:
            yield _MORE, ""
            return
        adj = self.w[j] in _ADJS
        if adj:
            j += 1
            if j == self.n:
                yield _MORE, ""
                return
        if word in ("a", "an") and (self.w[i + 1][0] in "aeiou") != (word == "an"):
            return
        noun = self.w[j]
        for number, table in (("sg", _SG), ("pl", _PL)):
            lemma = table.get(noun)
            if lemma is None or number not in det[0]:
                continue
            if kind == "animate" and lemma not in _ANIMATE:
                continue
            if kind == "inanimate" and lemma not in _INANIMATE:
                continue
            yield j + 1, number
            for end in self.pp(j + 1):
                yield end, number

    def pp(self, i: int) -> Iterator[int]:
        if i < self.n and self.w[i] in _PREPS:
            for end, _ in self.np(i + 1, "inanimate"):
                yield end

    def verb_then(self, i: int, number: str, table) -> Iterator[int]:
        """Positions after a verb of `table` agreeing with `number` at i (_MORE at the end)."""
        if i == self.n:
            yield _MORE
        elif self.w[i] in table and _agrees(table[self.w[i]], number):
            yield i + 1

    def clause(self, i: int) -> Iterator[int]:
        animate_ends = {end for end, _ in self.np(i, "animate")}
        for j, number in self.np(i, "any"):
            if j == _MORE:
                yield _MORE
                continue
            yield from self.verb_then(j, number, _UNACC)
            if j in animate_ends:
                yield from self.verb_then(j, number, _UNERG)
                for k in self.verb_then(j, number, _TRANS):
                    yield from (e for e, _ in self.np(k, "any")) if k != _MORE else (_MORE,)
                for k in self.verb_then(j, number, _CLAUSAL):
                    if k == _MORE or k == self.n:
                        yield _MORE
                    elif self.w[k] == "that":
                        yield from self.clause(k + 1)
            if self.passive:
                yield from self.passive_rest(j, number)

    def passive_rest(self, j: int, number: str) -> Iterator[int]:
        # "be" agreeing with the subject, a participle, "by"
        fits = (lambda w: _BE.get(w, ("", ""))[1] == number, _PARTICIPLES.__contains__,
                "by".__eq__)
        for k, fit in zip(range(j, j + 3), fits):
            if k == self.n:
                yield _MORE
                return
            if not fit(self.w[k]):
                return
        yield from (e for e, _ in self.np(j + 3, "animate"))


@lru_cache(maxsize=65536)
def _sentence_status(words: tuple[str, ...], passive: bool) -> str:
    """'complete' if `words` (without the final '.') is a clause, 'prefix' if it can still
    become one, else 'no'."""
    ends = set(_Parser(words, passive).clause(0))
    if len(words) in ends:
        return "complete"
    return "prefix" if _MORE in ends or not words else "no"


def is_grammatical(text: str | Sequence[str], *, prefix: bool = False,
                   passive: bool = False) -> bool:
    """Whether `text` is one or more sentences of the grammar. With ``prefix``, the words
    after the last '.' may be an unfinished sentence that the grammar can still complete."""
    words = text.split() if isinstance(text, str) else list(text)
    sentences, current = [], []
    for w in words:
        if w == ".":
            sentences.append(tuple(current))
            current = []
        else:
            current.append(w)
    if not sentences and not (prefix and current):
        return False
    if any(_sentence_status(s, passive) != "complete" for s in sentences):
        return False
    if current:
        # A token limit may also cut the last word itself ("the ca"): some word of the
        # lexicon that begins with it must continue the sentence.
        head, last = tuple(current[:-1]), current[-1]
        return prefix and any(_sentence_status((*head, w), passive) in ("complete", "prefix")
                              for w in _WORDS if w.startswith(last))
    return True
