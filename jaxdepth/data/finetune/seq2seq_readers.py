"""Readers for the published seq2seq benchmarks: COGS, COGS-vf, GeoQuery, English passivization.

Every reader returns a list of `Example`s, one per line, in file order, and keeps the text
exactly as published (case, tokenization, the `tv` / `lended` quirks of COGS, GeoQuery's
anonymised entities `m0`/`m1`, the passivization task marker). Sources, formats and quirks are
described in docs/datasets.md §2-§5. Malformed input (an empty file, bytes that are not UTF-8
included) raises DataError, a ValueError, naming `file:line`, so a bad line in a 100,000-line
file is found at once. COGS, COGS-vf and passivization ship a `dev` split; GeoQuery has none
(`split_validation` carves one out of train).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ...errors import DataError
from ..corpus.readers import text_lines

# Generalization types reported as "structural" (COGS; Petty et al. report them separately).
STRUCTURAL_TYPES = frozenset({"cp_recursion", "pp_recursion", "obj_pp_to_subj_pp"})
# Types of in-distribution evaluation examples. Passivization labels its in-distribution lines
# by their task marker, so `decl` and `passiv` are in-distribution types too.
IN_DISTRIBUTION_TYPES = frozenset({"in_distribution", "decl", "passiv"})
# COGS training-only lines (the lexicon and the single exposure example of each held-out word):
# neither in-distribution evaluation data nor a generalization type.
TRAINING_ONLY_TYPES = frozenset({"primitive"})
EXPOSURE_PREFIX = "exposure_example_"

PASSIVIZATION_MARKERS = ("decl", "passiv")
# passiv_en_nps.gen is entirely `passiv` lines whose active subject carries a PP, while every
# training passive has its PP (if any) on the object: the same structural shift as COGS's
# obj_pp_to_subj_pp, so gen lines get that type and count as structural.
PASSIVIZATION_GEN_TYPE = "obj_pp_to_subj_pp"

COGS_SPLITS = ("train", "dev", "test", "gen", "train_100")
GEOQUERY_SPLITS = ("train", "test")
PASSIVIZATION_SPLITS = ("train", "dev", "test", "gen")


@dataclass(frozen=True)
class Example:
    """One seq2seq pair. `type` is the generalization type ("in_distribution", a COGS gen
    type, "primitive", "exposure_example_*", or the passivization marker); `path`/`line`
    say where it came from (a 1-based line number; generated tasks use a pseudo path)."""

    source: str
    target: str
    type: str
    line: int = 0
    path: Optional[str] = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def is_generalization_type(t: str) -> bool:
    """True for out-of-distribution (gen) types, false for in-distribution and training-only."""
    return not (t in IN_DISTRIBUTION_TYPES or t in TRAINING_ONLY_TYPES
                or t.startswith(EXPOSURE_PREFIX))


def _check_split(task: str, split: str, allowed: Sequence[str]) -> None:
    if split not in allowed:
        raise ValueError(f"unknown {task} split {split!r}; expected one of {list(allowed)}")


def _read_columns(path: Path, n_columns: int) -> list[tuple[int, list[str]]]:
    """(line number, columns) of every line of a TSV file with exactly `n_columns` columns.

    Blank lines at the end of the file are tolerated (editors add them); a blank line followed
    by more data is an error, since it means the line count no longer matches the published one.
    """
    rows: list[tuple[int, list[str]]] = []
    blank_at: Optional[int] = None
    with text_lines(path, "data") as lines:
        for lineno, raw in enumerate(lines, start=1):
            # Some copies of these files have CRLF line ends (docs/datasets.md §5); the published
            # versions use LF, so strip either.
            line = raw.rstrip("\r\n")
            if not line.strip():
                blank_at = blank_at or lineno
                continue
            if blank_at is not None:
                raise DataError(f"{path}:{blank_at}: blank line inside the data")
            cols = line.split("\t")
            if len(cols) != n_columns:
                raise DataError(
                    f"{path}:{lineno}: expected {n_columns} tab-separated columns, got {len(cols)}"
                )
            for i, name in enumerate(("source", "target", "type")[:n_columns]):
                if not cols[i].strip():
                    raise DataError(f"{path}:{lineno}: empty {name}")
            rows.append((lineno, cols))
    if not rows:
        raise DataError(f"{path}: empty file (no examples)")
    return rows


def read_cogs(directory: str | Path, split: str) -> list[Example]:
    """COGS or COGS-vf (`sentence \\t lf \\t type`). Splits: train, dev, test, gen, and
    train_100 when `train_100.tsv` is present (the downloader does not fetch it:
    docs/datasets.md §2).

    `primitive` and `exposure_example_*` lines are kept as they are: they belong to training.
    """
    _check_split("COGS", split, COGS_SPLITS)
    path = Path(directory) / f"{split}.tsv"
    if split == "train_100" and not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: train_100 is optional and not part of the standard download"
        )
    return [Example(c[0], c[1], c[2], n, str(path)) for n, c in _read_columns(path, 3)]


def read_geoquery(directory: str | Path, split: str) -> list[Example]:
    """GeoQuery standard split in the NQG format (`question \\t funql`), type in_distribution.

    There is no dev set: use `split_validation` on the train examples.
    """
    _check_split("GeoQuery", split, GEOQUERY_SPLITS)
    path = Path(directory) / f"{split}.tsv"
    return [Example(c[0], c[1], "in_distribution", n, str(path))
            for n, c in _read_columns(path, 2)]


def read_passivization(directory: str | Path, split: str) -> list[Example]:
    """English passivization (Mueller et al. 2022), `passiv_en_nps.{split}`.

    Column 1 is `source + " " + marker`; the marker (decl / passiv) says which task to perform,
    so it stays in the source the model reads. The type is the marker for train/dev/test, and
    PASSIVIZATION_GEN_TYPE for gen (where every line must be `passiv`).
    """
    _check_split("passivization", split, PASSIVIZATION_SPLITS)
    path = Path(directory) / f"passiv_en_nps.{split}"
    examples = []
    for n, (source, target) in _read_columns(path, 2):
        marker = source.split()[-1]
        if marker not in PASSIVIZATION_MARKERS:
            raise DataError(
                f"{path}:{n}: source must end with a task marker {PASSIVIZATION_MARKERS}, "
                f"got {marker!r}"
            )
        if len(source.split()) == 1:
            raise DataError(f"{path}:{n}: source has a task marker but no sentence")
        if split == "gen":
            if marker != "passiv":
                raise DataError(f"{path}:{n}: gen lines must be 'passiv', got {marker!r}")
            kind = PASSIVIZATION_GEN_TYPE
        else:
            kind = marker
        examples.append(Example(source, target, kind, n, str(path)))
    return examples


_READERS = {
    "cogs": read_cogs,
    "cogs_vf": read_cogs,
    "geoquery": read_geoquery,
    "passivization": read_passivization,
}


def load_task(name: str, directory: str | Path, split: str) -> list[Example]:
    """Examples of split `split` of task `name` (cogs, cogs_vf, geoquery, passivization) read
    from `directory`."""
    if name not in _READERS:
        raise ValueError(f"unknown task {name!r}; expected one of {list(_READERS)}")
    return _READERS[name](directory, split)


def split_validation(
    examples: Sequence[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """(train, validation): a random `fraction` of `examples` held out for validation.

    This is how GeoQuery, which has no dev set, is validated. The choice is a pure function of
    (len(examples), fraction, seed); both parts keep the original order, and the validation part
    has round(fraction * n) examples, at least 1.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    n = len(examples)
    n_val = max(1, int(round(fraction * n)))
    if n_val >= n:
        raise ValueError(f"cannot hold out {n_val} of {n} examples and still train")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng(seed).permutation(n)[:n_val]] = True
    train = [e for e, h in zip(examples, held) if not h]
    val = [e for e, h in zip(examples, held) if h]
    return train, val
