"""Compositional seq2seq tasks built from the embedded grammar, with COGS-style splits.

Two tasks:
  * ``semantic_parsing``: sentence text -> its variable-free logical form (COGS-vf style).
  * ``passivization``: mirrors Mueller et al.'s passiv_en_nps format. The source is an active
    sentence followed by a task marker: ``" passiv"`` (target = its passive) or ``" decl"``
    (target = the sentence itself). About a third of in-distribution examples are ``passiv``,
    as in the published data (32,735 of 100,000).

Splits: ``train``, ``dev``, ``test`` (in-distribution, type "in_distribution") and two
generalization splits with ``n_eval`` examples per type:
  * ``gen_lexical``: a word seen in training in one role only appears in another.
      - ``subj_to_obj_common``: the noun HELD_OUT_NOUN never is an object in training
        (``forbid`` on ``obj_noun``, which also covers embedded clauses); gen sentences have
        it as the main-clause object.
      - ``obj_to_subj_proper``: the name HELD_OUT_NAME never is a subject in training;
        gen sentences have it as the main-clause subject.
    Roles refer to the active source sentence (in a passivization target the active object
    becomes the passive subject).
  * ``gen_structural``: training has PP nesting <= 1 and CP nesting <= 1; and for
    ``semantic_parsing`` no subject PPs, for ``passivization`` no subject PPs in ``passiv``
    examples (``decl`` copies may have them, as in the published data).
      - ``pp_recursion``: PP nesting 2-3 (on objects).
      - ``cp_recursion`` (semantic_parsing only): CP nesting 2-3. A passivizable clause has a
        direct object and hence no complement clause, so passivization has no CP type.
      - ``obj_pp_to_subj_pp``: a PP on the main-clause subject.
    Every gen example keeps all other training restrictions, so it differs from training in
    exactly one respect.

Every split is a pure function of (task, n_train, n_eval, seed). Sources are unique across all
splits: no dev, test or gen source occurs in train.
"""
from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from typing import Optional

import numpy as np

from jaxdepth.data.embedded.grammar import (ANIMATE_NOUNS, INANIMATE_NOUNS, NAMES, GrammarConfig,
                                            Sentence, generate, to_passive)
from jaxdepth.data.finetune.seq2seq_readers import Example

GRAMMAR_TASKS = ("semantic_parsing", "passivization")
SPLITS = ("train", "dev", "test", "gen_lexical", "gen_structural")

HELD_OUT_NOUN = "hedgehog"  # animate, so it can be a subject (seen) and an object (held out)
HELD_OUT_NAME = "paula"
TRAIN_MAX_PP_DEPTH = 1
TRAIN_MAX_CP_DEPTH = 1
GEN_MAX_DEPTH = 3  # structural gen examples nest 2..GEN_MAX_DEPTH deep

LEXICAL_TYPES = ("subj_to_obj_common", "obj_to_subj_proper")
STRUCTURAL_TYPES_BY_TASK = {
    "semantic_parsing": ("pp_recursion", "cp_recursion", "obj_pp_to_subj_pp"),
    "passivization": ("pp_recursion", "obj_pp_to_subj_pp"),
}
# Share of `passiv` among in-distribution passivization examples (published train: 32735/100000).
P_PASSIV = 1 / 3

# Sentences generated per round of rejection sampling: small at first, so that small tasks
# (tests, smoke runs) do not pay for 2048 sentences per stream, then doubling up to the cap.
_FIRST_CHUNK, _MAX_CHUNK = 128, 4096
_MAX_ROUNDS = 500  # ~2M sentences: a stream still short after that is a configuration bug


# ---------------------------------------------------------------------------------------
# Examples from sentences


def semantic_parsing_example(sentence: Sentence, type: str = "in_distribution",
                             line: int = 0, path: Optional[str] = None) -> Example:
    return Example(sentence.text, sentence.lf, type, line, path)


def passivization_example(sentence: Sentence, marker: str, type: str = "in_distribution",
                          line: int = 0, path: Optional[str] = None) -> Example:
    """`marker` "passiv": active -> passive; "decl": identity copy. The source is the active
    sentence with the marker as its last token, as in passiv_en_nps."""
    if marker == "decl":
        target = sentence.text
    elif marker == "passiv":
        passive = to_passive(sentence)
        if passive is None or sentence.voice != "active":
            raise ValueError(f"no passive for {sentence.text!r}: the main verb needs a "
                             "direct object and the sentence must be active")
        target = passive.text
    else:
        raise ValueError(f"marker must be 'decl' or 'passiv', got {marker!r}")
    return Example(f"{sentence.text} {marker}", target, type, line, path)


# ---------------------------------------------------------------------------------------
# Sentence streams


def _subseed(seed: int, tag: str, round_: int) -> int:
    # crc32, not hash(): Python salts str hashes per process, and splits must be reproducible.
    return int(np.random.SeedSequence([seed, zlib.crc32(tag.encode()), round_])
               .generate_state(1)[0])


def _stream(cfg: GrammarConfig, seed: int, tag: str,
            accept: Callable[[Sentence], bool]) -> Iterator[Sentence]:
    """Accepted sentences of an endless deterministic sequence of `generate` calls."""
    total = 0
    for round_ in range(_MAX_ROUNDS):
        chunk = min(_MAX_CHUNK, _FIRST_CHUNK << min(round_, 10))
        total += chunk
        for s in generate(chunk, _subseed(seed, tag, round_), cfg):
            if accept(s):
                yield s
    raise RuntimeError(f"stream {tag!r} ran out after {total} sentences; "
                       "too many examples requested for this configuration")


def _is_transitive(s: Sentence) -> bool:
    return s.tree.obj is not None


def _configs(noun: str, name: str) -> dict[str, GrammarConfig]:
    """Generation settings: the training distribution and one setting per gen type."""
    forbid = frozenset({(noun, "obj_noun"), (name, "subj_noun")})
    train = GrammarConfig(max_pp_depth=TRAIN_MAX_PP_DEPTH, max_cp_depth=TRAIN_MAX_CP_DEPTH,
                          subj_pp=False, forbid=forbid)
    # Lexical gen: restrict the slot to the held-out word (other restrictions unchanged), so
    # most generated sentences show it; the accept filters keep those that do.
    other_nouns = {(n, "obj_noun") for n in ANIMATE_NOUNS + INANIMATE_NOUNS if n != noun}
    other_names = {(n, "subj_noun") for n in NAMES if n != name}
    return {
        "train": train,
        "train_subj_pp": dataclasses.replace(train, subj_pp=True),
        "subj_to_obj_common": dataclasses.replace(
            train, forbid=(forbid - {(noun, "obj_noun")}) | other_nouns),
        # Names are 20% of animate subjects; with only `name` allowed, ~1 in 5 subjects is it.
        "obj_to_subj_proper": dataclasses.replace(
            train, forbid=(forbid - {(name, "subj_noun")}) | other_names),
        "pp_recursion": dataclasses.replace(train, max_pp_depth=GEN_MAX_DEPTH, p_pp=0.6),
        "cp_recursion": dataclasses.replace(train, max_cp_depth=GEN_MAX_DEPTH, p_cp=0.7),
        "obj_pp_to_subj_pp": dataclasses.replace(train, subj_pp=True, p_pp=0.5),
    }


def _accept(kind: str, noun: str, name: str) -> Callable[[Sentence], bool]:
    return {
        "subj_to_obj_common": lambda s: (s.tree.obj is not None and s.tree.obj.det is not None
                                         and s.tree.obj.head == noun),
        "obj_to_subj_proper": lambda s: s.tree.subj.det is None and s.tree.subj.head == name,
        "pp_recursion": lambda s: s.pp_depth >= 2,
        "cp_recursion": lambda s: s.cp_depth >= 2,
        "obj_pp_to_subj_pp": lambda s: s.tree.subj.pp is not None,
    }[kind]


# ---------------------------------------------------------------------------------------
# Tasks


def build_task(name: str, n_train: int, n_eval: int,
               seed: int) -> dict[str, list[tuple[Example, Sentence]]]:
    """Like `make_task`, but each example comes with the active `Sentence` it was made from,
    so callers (and tests) can inspect roles and depths."""
    if name not in GRAMMAR_TASKS:
        raise ValueError(f"unknown grammar task {name!r}; expected one of {list(GRAMMAR_TASKS)}")
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got {n_train}, {n_eval}")
    cfgs = _configs(HELD_OUT_NOUN, HELD_OUT_NAME)
    seen: set[str] = set()  # sources already used, in any split
    out: dict[str, list[tuple[Example, Sentence]]] = {s: [] for s in SPLITS}

    def take(split: str, pairs: Iterator[tuple[Sentence, Example]], n: int) -> None:
        """Append to `split` the next `n` examples of `pairs` whose source no split has yet."""
        taken = 0
        while taken < n:
            s, ex = next(pairs)
            if ex.source in seen:
                continue
            seen.add(ex.source)
            out[split].append((dataclasses.replace(ex, line=len(out[split]) + 1,
                                                   path=f"grammar:{name}/{split}"), s))
            taken += 1

    if name == "passivization":
        # One generator per marker: `passiv` sources need a transitive main clause and no
        # subject PP; `decl` copies are any training sentence, subject PPs allowed.
        decl_stream = _stream(cfgs["train_subj_pp"], seed, "decl", lambda s: True)
        passiv_stream = _stream(cfgs["train"], seed, "passiv", _is_transitive)
        coin = np.random.default_rng(_subseed(seed, "marker", 0))

        def in_distribution() -> Iterator[tuple[Sentence, Example]]:
            while True:
                if coin.random() < P_PASSIV:
                    s = next(passiv_stream)
                    yield s, passivization_example(s, "passiv")
                else:
                    s = next(decl_stream)
                    yield s, passivization_example(s, "decl")

        def gen(kind: str, stream: Iterator[Sentence]) -> Iterator[tuple[Sentence, Example]]:
            return ((s, passivization_example(s, "passiv", kind)) for s in stream
                    if _is_transitive(s))
    else:
        def in_distribution() -> Iterator[tuple[Sentence, Example]]:
            for s in _stream(cfgs["train"], seed, "in_distribution", lambda s: True):
                yield s, semantic_parsing_example(s)

        def gen(kind: str, stream: Iterator[Sentence]) -> Iterator[tuple[Sentence, Example]]:
            return ((s, semantic_parsing_example(s, kind)) for s in stream)

    # train, dev and test are consecutive slices of one stream, so they never share a source.
    pairs = in_distribution()
    for split, n in (("train", n_train), ("dev", n_eval), ("test", n_eval)):
        take(split, pairs, n)
    for split, kinds in (("gen_lexical", LEXICAL_TYPES),
                         ("gen_structural", STRUCTURAL_TYPES_BY_TASK[name])):
        for kind in kinds:
            accept = _accept(kind, HELD_OUT_NOUN, HELD_OUT_NAME)
            take(split, gen(kind, _stream(cfgs[kind], seed, kind, accept)), n_eval)
    return out


def make_task(name: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
    """{split: examples} for grammar task `name` (see the module docstring). dev and test have
    `n_eval` examples; gen_lexical and gen_structural have `n_eval` per generalization type."""
    built = build_task(name, n_train, n_eval, seed)
    return {split: [ex for ex, _ in pairs] for split, pairs in built.items()}

