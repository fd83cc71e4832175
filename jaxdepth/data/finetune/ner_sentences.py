"""NER data (docs/design.md §4): readers, IOB1 -> IOB2, sub-token labels, few-shot.

Sources and file formats: docs/datasets.md §7 (WikiAnn) and §8 (CoNLL-2003).

Sentences are returned with IOB2 tags whatever the file's scheme, so the span scorer
(``jaxdepth.analysis.entity_f1``) and the label set only ever see IOB2. Every malformed line
raises ValueError naming ``file:line``.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import DataError
from ..corpus.readers import text_lines

# WikiAnn's tag set, in the order the data card lists it; index = label id.
LABELS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")


@dataclasses.dataclass(frozen=True)
class Sentence:
    tokens: tuple[str, ...]
    tags: tuple[str, ...]  # IOB2
    # where each token was read ("file:line"), for errors; not part of the sentence's value
    where: tuple[str, ...] = dataclasses.field(default=(), compare=False, repr=False)


def check_tag(tag: str, where: str) -> None:
    if tag != "O" and not (len(tag) > 2 and tag[0] in "BI" and tag[1] == "-"):
        raise DataError(f"{where}: invalid tag {tag!r} (expected O, B-TYPE or I-TYPE)")


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (I- everywhere, B- only between adjacent same-type entities) to IOB2 (B- starts all).

    An I-X becomes B-X when it opens an entity: after O, at the start, or after another type.
    B-X is kept: in IOB1 it already marks the start of an entity that touches one of its type.
    """
    out: list[str] = []
    prev_type = None  # None: outside any entity
    for tag in tags:
        check_tag(tag, "iob1_to_iob2")
        if tag == "O":
            out.append(tag)
            prev_type = None
            continue
        typ = tag[2:]
        out.append(f"B-{typ}" if tag[0] == "B" or typ != prev_type else tag)
        prev_type = typ
    return out


def _read_blocks(path: Path, parse_line):
    """Sentences of a one-token-per-line file, as (tokens, tags, "file:line" of each token);
    parse_line(line, where) -> (token, tag) or None."""
    sentences: list[tuple[list[str], list[str], list[str]]] = []
    tokens: list[str] = []
    tags: list[str] = []
    where: list[str] = []
    with text_lines(path, "NER") as lines:
        for lineno, line in enumerate(lines, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if tokens:
                    sentences.append((tokens, tags, where))
                    tokens, tags, where = [], [], []
                continue
            parsed = parse_line(line, f"{path}:{lineno}")
            if parsed is not None:
                tokens.append(parsed[0])
                tags.append(parsed[1])
                where.append(f"{path}:{lineno}")
    if tokens:  # the last sentence need not end with a blank line
        sentences.append((tokens, tags, where))
    return sentences


def read_conll2003(path: str | Path) -> list[Sentence]:
    """CoNLL-2003 ``token POS chunk NER`` lines (IOB1), returned with IOB2 tags.

    ``-DOCSTART-`` document markers are skipped; blank lines separate sentences.
    """
    def parse(line: str, where: str):
        fields = line.split()
        if fields[0] == "-DOCSTART-":
            return None
        if len(fields) != 4:
            raise DataError(f"{where}: expected 4 space-separated fields "
                             f"(token POS chunk tag), got {len(fields)}")
        check_tag(fields[3], where)
        return fields[0], fields[3]

    return [Sentence(tuple(tok), tuple(iob1_to_iob2(tags)), tuple(where))
            for tok, tags, where in _read_blocks(Path(path), parse)]


def read_wikiann(path: str | Path) -> list[Sentence]:
    """WikiAnn (Rahimi et al.) ``lang:token <TAB> tag`` lines (IOB2); the ``lang:`` is stripped.

    Only the first colon separates the language, since tokens may contain colons (``en::``).
    """
    def parse(line: str, where: str):
        fields = line.split("\t")
        if len(fields) != 2:
            raise DataError(f"{where}: expected 'lang:token<TAB>tag', got {len(fields)} "
                             "tab-separated fields")
        lang, colon, token = fields[0].partition(":")
        if not colon or not lang or not token:
            raise DataError(f"{where}: expected a 'lang:token' field, got {fields[0]!r}")
        check_tag(fields[1], where)
        return token, fields[1]

    return [Sentence(tuple(tok), tuple(tags), tuple(where))
            for tok, tags, where in _read_blocks(Path(path), parse)]


def encode_tags(tags: Sequence[str], labels: Sequence[str],
                where: Sequence[str] = ()) -> list[int]:
    """Label ids of tags; an unknown tag is an error rather than a silent O, naming the
    "file:line" it was read from when `where` (one per tag) says."""
    index = {label: i for i, label in enumerate(labels)}
    missing = sorted(set(tags) - index.keys())
    if missing:
        if len(where) == len(tags):
            at = next(k for k, t in enumerate(tags) if t not in index)
            raise DataError(f"{where[at]}: tag {tags[at]!r} is not in the label set "
                            f"{list(labels)}")
        raise DataError(f"tags {missing} are not in the label set {list(labels)}")
    return [index[t] for t in tags]


def few_shot_sample(sentences: Sequence, n_per_class: int, n_classes: int,
                    seed: int) -> list:
    """N * C sentences drawn uniformly without replacement; the same seed gives the same draw."""
    size = n_per_class * n_classes
    if size <= 0:
        raise ValueError(f"need a positive sample size, got {n_per_class} x {n_classes}")
    if size > len(sentences):
        raise ValueError(f"cannot sample {n_per_class} x {n_classes} = {size} sentences "
                         f"from {len(sentences)}")
    idx = np.random.default_rng(seed).choice(len(sentences), size=size, replace=False)
    return [sentences[i] for i in idx]


# ----------------------------------------------------------------------------- task directories

CONLL_LABELS: tuple[str, ...] = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC",
                                 "B-MISC", "I-MISC")
# Accepted file names per split, first match wins: WikiAnn (Rahimi et al.), CoNLL-2003 as
# distributed (eng.*), and the common train/valid/test.txt renaming.
SPLIT_FILES = {"train": ("train", "eng.train", "train.txt"),
               "dev": ("dev", "eng.testa", "valid.txt", "dev.txt"),
               "test": ("test", "eng.testb", "test.txt")}


def split_path(task_dir: str | Path, split: str) -> Path:
    d = Path(task_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"task.dir: NER directory not found: {d}")
    for name in SPLIT_FILES[split]:
        if (d / name).is_file():
            return d / name
    raise FileNotFoundError(f"task.dir: no {split} file in {d} (looked for "
                            f"{', '.join(SPLIT_FILES[split])})")


def detect_format(path: Path) -> str:
    """'wikiann' (``lang:token<TAB>tag``) or 'conll' (``token POS chunk tag``), from the first
    line."""
    with text_lines(path, "NER") as lines:
        for line in lines:
            if line.strip():
                fields = line.rstrip("\r\n").split("\t")
                return "wikiann" if len(fields) == 2 and ":" in fields[0] else "conll"
    raise DataError(f"{path}: empty NER file")


def ner_labels(task_dir: str | Path) -> tuple[str, ...]:
    """The dataset's fixed label set (WikiAnn: PER/ORG/LOC; CoNLL-2003: + MISC), IOB2."""
    return LABELS if detect_format(split_path(task_dir, "train")) == "wikiann" else CONLL_LABELS


def read_split(task_dir: str | Path, split: str) -> list[Sentence]:
    """The split's sentences. A process parses a file once and reuses it while the file is
    unchanged (an experiment runs many units on the same files in one process)."""
    path = Path(split_path(task_dir, split))
    st = path.stat()
    return list(_parsed(str(path.resolve()), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[Sentence, ...]:
    """mtime and size are part of the key, so an edited file is parsed again."""
    p = Path(path)
    return tuple((read_wikiann if detect_format(p) == "wikiann" else read_conll2003)(p))


def n_classes(labels: Sequence[str]) -> int:
    """C of few-shot sampling: entity types in a label set."""
    return len({t[2:] for t in labels if t != "O"})


def encode_sentences(sentences: Sequence[Sentence], word_ids, labels: Sequence[str], *,
                     seq_len: int, max_words: int, cls_id: int, sep_id: int,
                     pad_id: int) -> tuple[dict[str, np.ndarray], int]:
    """Arrays for the NER model, and how many words did not fit (scored as predicted O).

    ``[CLS] pieces... [SEP]`` padded to seq_len; ``positions`` [n, max_words] holds the first
    sub-token of each word that fits, ``labels`` its label id (-1 past the sentence's words).
    ``word_ids(words)`` gives the piece ids of every word of a sentence.
    """
    n = len(sentences)
    tokens = np.full((n, seq_len), pad_id, np.int32)
    mask = np.zeros((n, seq_len), np.int32)
    positions = np.zeros((n, max_words), np.int32)
    label_ids = np.full((n, max_words), -1, np.int32)
    dropped = 0
    for i, s in enumerate(sentences):
        ids = encode_tags(s.tags, labels, s.where)
        pieces_per_word = [p if p else None for p in word_ids(s.tokens)]
        seq, kept = [cls_id], 0
        for w, pieces in enumerate(pieces_per_word):
            if pieces is None:
                raise ValueError(f"word {w} ({s.tokens[w]!r}) has no sub-tokens, so its label "
                                 f"would be lost")
            if len(seq) + len(pieces) + 1 > seq_len or kept == max_words:
                break
            positions[i, kept] = len(seq)
            label_ids[i, kept] = ids[w]
            seq.extend(pieces)
            kept += 1
        dropped += len(s.tokens) - kept
        seq.append(sep_id)
        tokens[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
    return {"tokens": tokens, "mask": mask, "segments": np.zeros_like(tokens),
            "positions": positions, "labels": label_ids}, dropped


def decode_tags(pred_ids: np.ndarray, label_ids: np.ndarray, n_words: Sequence[int],
                labels: Sequence[str]) -> list[list[str]]:
    """Predicted tags per sentence from ``encode_sentences``' layout; words that did not fit
    (label -1 at their slot) get O."""
    out = []
    for row, gold, n in zip(pred_ids, label_ids, n_words):
        kept = [labels[int(j)] for j in row[:int((gold >= 0).sum())]]
        out.append(kept + ["O"] * (n - len(kept)))
    return out
