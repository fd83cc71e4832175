"""Probing and classification tasks from the embedded grammar (SentEval-style).

Simoulin & Crabbé probe and fine-tune their models on what a sentence encodes. With the
embedded grammar (`grammar.py`) every feature is known exactly, so the tasks need no
annotation:

  * ``tense``        sentence -> tense of the main verb: "past" / "present"
  * ``subj_number``  sentence -> number of the main-clause subject: "sg" / "pl"
  * ``obj_number``   sentence -> number of the main-clause direct object: "sg" / "pl"
                     (only sentences whose main verb has a direct object)
  * ``roles``        token-level: each piece -> the grammatical role of its word (`ROLE_NAMES`,
                     every role string the grammar can produce, sorted)

`make_probe_data` returns splits "train" (n_train examples), "dev" and "test" (n_eval each).
Sentences come from one deterministic stream of `grammar.generate` calls seeded from
``(seed, task)``; train, dev and test are consecutive stretches of it, and a sentence text is
used at most once over all splits (so splits are disjoint and have no repeats). Sentence tasks are
balanced: every split has the same number of examples of each label (a sentence whose label is
already full in the split being filled is passed over), and rows are shuffled deterministically.

Each example is ``[CLS] sentence [SEP]`` padded to ``seq_len``; a batch is a dict of numpy arrays
(N rows, T = seq_len):

    tokens    int32 [N, T]   ids; PAD (0) after [SEP]
    segments  int32 [N, T]   all 0
    mask      int32 [N, T]   1 on [CLS] sentence [SEP], 0 on padding
    labels    int32 [N]      sentence tasks: index into `label_names(task)`
    roles     int32 [N, T]   roles task: index into `ROLE_NAMES` of the word each piece belongs to
                             (every piece of a word gets its word's role); -1 on [CLS], [SEP] and
                             padding
    labels    int32 [N, T]   roles task: a copy of `roles` (token-level labels)

Sentences longer than ``seq_len - 2`` pieces are skipped, never truncated; `build_probe_data`
returns the counts (`ProbeStats`) and `make_probe_data` logs them.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import zlib
from collections.abc import Iterator

import numpy as np

from jaxdepth.data.embedded import grammar
from jaxdepth.data.embedded.grammar import GrammarConfig, Sentence
from jaxdepth.data.corpus.mlm_sop import word_start_table
from jaxdepth.data.corpus.tokenizer import CLS_ID, PAD_ID, SEP_ID, UNK_ID, Tokenizer

log = logging.getLogger(__name__)

PROBE_TASKS = ("tense", "subj_number", "obj_number", "roles")
SENTENCE_TASKS = ("tense", "subj_number", "obj_number")
SPLITS = ("train", "dev", "test")

# grammar.ROLES lists every role the grammar produces (active and passive, main and embedded
# clauses) in a structural order; probing uses them sorted, so ids do not depend on that order.
ROLE_NAMES: tuple[str, ...] = tuple(sorted(grammar.ROLES))
_ROLE_ID = {r: i for i, r in enumerate(ROLE_NAMES)}
IGNORE_ROLE = -1  # role id of [CLS], [SEP] and padding

_LABEL_NAMES = {
    "tense": ("past", "present"),
    "subj_number": ("sg", "pl"),
    "obj_number": ("sg", "pl"),
    "roles": ROLE_NAMES,
}

_CHUNK = 256  # sentences per generate() call of the stream
_MIN_BUDGET = 20_000  # a stream gives up after max(_MIN_BUDGET, 50 * needed) sentences


def label_names(task: str) -> tuple[str, ...]:
    """The label strings of `task`; a label id is an index into this tuple."""
    _check_task(task)
    return _LABEL_NAMES[task]


def _check_task(task: str) -> None:
    if task not in PROBE_TASKS:
        raise ValueError(f"unknown probing task {task!r}; expected one of {list(PROBE_TASKS)}")


# ---------------------------------------------------------------------------------------
# Piece / word alignment


@functools.lru_cache(maxsize=8)
def _vocab_tables(model_proto: bytes) -> tuple[tuple[str, ...], np.ndarray]:
    """(piece of each id, word-start flag of each id) for a tokenizer's model."""
    tok = Tokenizer(model_proto)
    return tuple(tok.id_to_piece(i) for i in range(tok.vocab_size)), word_start_table(tok)


def sentence_roles(sentence: Sentence, tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(ids, role_ids), both int32 [n_pieces]: the pieces of ``sentence.text`` (no specials)
    and, for each, the `ROLE_NAMES` index of the word it belongs to.

    Raises ValueError naming the sentence when the pieces, grouped at word starts, do not spell
    the sentence's words (an unknown character, or a word split across a space)."""
    pieces, word_start = _vocab_tables(tok.model_proto)
    ids = np.asarray(tok.encode(sentence.text), dtype=np.int32)
    words = sentence.words
    if len(sentence.roles) != len(words):
        raise ValueError(f"{sentence.text!r}: {len(sentence.roles)} roles for {len(words)} words")
    if UNK_ID in ids:
        raise ValueError(f"{sentence.text!r}: the tokenizer maps part of it to unk "
                         f"(pieces {[pieces[i] for i in ids]}); cannot align pieces to words")
    starts = np.flatnonzero(word_start[ids]) if len(ids) else np.zeros(0, np.int64)
    spelled = ["".join(pieces[i] for i in ids[a:b]).replace("\u2581", "")
               for a, b in zip(starts.tolist(), starts[1:].tolist() + [len(ids)])]
    if len(ids) == 0 or starts[0] != 0 or spelled != list(words):
        raise ValueError(f"{sentence.text!r}: pieces {[pieces[i] for i in ids]} grouped at word "
                         f"starts spell {spelled}, not the words {list(words)}")
    word_of_piece = np.cumsum(word_start[ids]) - 1
    word_roles = np.array([_ROLE_ID[r] for r in sentence.roles], dtype=np.int32)
    return ids, word_roles[word_of_piece]


# ---------------------------------------------------------------------------------------
# Sentence selection


@dataclasses.dataclass
class ProbeStats:
    """What selection passed over. `n_too_long`: sentences of more than seq_len - 2 pieces;
    `n_duplicate`: texts already used (in any split); `n_no_label`: obj_number sentences without
    a direct object; `n_class_full`: sentences whose label was already full in the split."""

    n_generated: int = 0
    n_too_long: int = 0
    n_duplicate: int = 0
    n_no_label: int = 0
    n_class_full: int = 0
    max_pieces: int = 0  # longest kept sentence, in pieces (no specials)


def _subseed(seed: int, *tags) -> np.random.SeedSequence:
    # crc32, not hash(): Python salts str hashes per process, and data must be reproducible.
    return np.random.SeedSequence(
        [seed] + [zlib.crc32(t.encode()) if isinstance(t, str) else int(t) for t in tags])


def _stream(task: str, seed: int, cfg: GrammarConfig, budget: int,
            stats: ProbeStats) -> Iterator[Sentence]:
    round_ = 0
    while stats.n_generated < budget:
        sub = int(_subseed(seed, "probing", task, round_).generate_state(1)[0])
        for s in grammar.generate(_CHUNK, sub, cfg):
            stats.n_generated += 1
            yield s
        round_ += 1


@dataclasses.dataclass(frozen=True)
class _Item:
    sentence: Sentence
    ids: np.ndarray
    roles: np.ndarray
    label: int  # sentence tasks; -1 for roles


def _select(task: str, tok: Tokenizer, n_train: int, n_eval: int, seed: int, seq_len: int,
            cfg: GrammarConfig) -> tuple[dict[str, list[_Item]], ProbeStats]:
    _check_task(task)
    for name, v in (("n_train", n_train), ("n_eval", n_eval), ("seq_len", seq_len),
                    ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"need n_train >= 0 and n_eval >= 0, got {n_train}, {n_eval}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if seq_len < 3:
        raise ValueError(f"seq_len={seq_len} must be >= 3 ([CLS] a piece [SEP])")
    n_classes = len(_LABEL_NAMES[task]) if task in SENTENCE_TASKS else 1
    for name, n in (("n_train", n_train), ("n_eval", n_eval)):
        if n % n_classes:
            raise ValueError(f"{name}={n} must be a multiple of the {n_classes} labels of "
                             f"{task!r} (splits are balanced)")
    sizes = {"train": n_train, "dev": n_eval, "test": n_eval}
    stats = ProbeStats()
    budget = max(_MIN_BUDGET, 50 * (n_train + 2 * n_eval))
    stream = _stream(task, seed, cfg, budget, stats)
    seen: set[str] = set()
    out: dict[str, list[_Item]] = {}
    for split in SPLITS:
        quota = [sizes[split] // n_classes] * n_classes
        items: list[_Item] = []
        while len(items) < sizes[split]:
            s = next(stream, None)
            if s is None:
                raise RuntimeError(
                    f"probing task {task!r}: only {len(items)} of {sizes[split]} {split} examples "
                    f"after {stats.n_generated} sentences ({stats}); is seq_len={seq_len} too "
                    "small?")
            if task in SENTENCE_TASKS:
                feature = getattr(s, task)  # None: obj_number without an object
                if feature is None:
                    stats.n_no_label += 1
                    continue
                label = _LABEL_NAMES[task].index(feature)
                if quota[label] == 0:
                    stats.n_class_full += 1
                    continue
            else:
                label = 0
            if s.text in seen:
                stats.n_duplicate += 1
                continue
            ids, roles = sentence_roles(s, tok)
            if len(ids) > seq_len - 2:
                stats.n_too_long += 1
                continue
            seen.add(s.text)
            quota[label] -= 1
            stats.max_pieces = max(stats.max_pieces, len(ids))
            items.append(_Item(s, ids, roles, label if task in SENTENCE_TASKS else -1))
        # Interleave the labels (the tail of a balanced split would otherwise be one class).
        order = np.random.default_rng(_subseed(seed, "probing-order", task, split)).permutation(
            len(items))
        out[split] = [items[i] for i in order]
    return out, stats


def _encode(task: str, items: list[_Item], seq_len: int) -> dict[str, np.ndarray]:
    n, T = len(items), seq_len
    tokens = np.full((n, T), PAD_ID, dtype=np.int32)
    mask = np.zeros((n, T), dtype=np.int32)
    roles = np.full((n, T), IGNORE_ROLE, dtype=np.int32)
    for r, it in enumerate(items):
        k = len(it.ids)
        tokens[r, 0] = CLS_ID
        tokens[r, 1:1 + k] = it.ids
        tokens[r, 1 + k] = SEP_ID
        mask[r, :k + 2] = 1
        roles[r, 1:1 + k] = it.roles
    batch = {"tokens": tokens, "segments": np.zeros((n, T), dtype=np.int32), "mask": mask}
    if task == "roles":
        batch["roles"] = roles
        batch["labels"] = roles.copy()
    else:
        batch["labels"] = np.array([it.label for it in items], dtype=np.int32)
    return batch


def build_probe_data(task: str, tok: Tokenizer, *, n_train: int, n_eval: int, seed: int,
                     seq_len: int, cfg: GrammarConfig = GrammarConfig(),
                     ) -> tuple[dict[str, dict[str, np.ndarray]], ProbeStats]:
    """`make_probe_data` and the selection statistics."""
    items, stats = _select(task, tok, n_train, n_eval, seed, seq_len, cfg)
    return {split: _encode(task, its, seq_len) for split, its in items.items()}, stats


def make_probe_data(task: str, tok: Tokenizer, *, n_train: int, n_eval: int, seed: int,
                    seq_len: int, cfg: GrammarConfig = GrammarConfig(),
                    ) -> dict[str, dict[str, np.ndarray]]:
    """{"train", "dev", "test"} -> batch arrays for probing task `task` (see the module
    docstring); a pure function of (task, tokenizer, n_train, n_eval, seed, seq_len, cfg)."""
    data, stats = build_probe_data(task, tok, n_train=n_train, n_eval=n_eval, seed=seed,
                                   seq_len=seq_len, cfg=cfg)
    log.info("probing %s: %d sentences generated, %d skipped as longer than %d pieces, "
             "%d duplicates, %d without label, %d over a full class; longest kept %d pieces",
             task, stats.n_generated, stats.n_too_long, seq_len - 2, stats.n_duplicate,
             stats.n_no_label, stats.n_class_full, stats.max_pieces)
    return data

