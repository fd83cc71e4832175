"""An experiment's results as rows: reading, de-duplicating, aggregating over seeds.

Shared by the tables (report.py) and the figures (plots.py); the row format is described in
report.py.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from jaxdepth.analysis.exact_match import mean_ci95
from jaxdepth.errors import warn

# Identity of a run: a later row with the same identity replaces an earlier one. equal_loss rows
# are additionally keyed by `threshold`, so a sweep that logs several thresholds keeps them all.
RUN_KEY = ("kind", "size_class", "depth", "seed", "task", "init")


# --------------------------------------------------------------------------------------------
# Loading


RESULTS_DIR = "results"  # an experiment's: one <unit>.json per finished unit
LEGACY_RESULTS = "results.jsonl"  # appended to by jaxdepth up to f102334: read, never written
UNREADABLE = ".unreadable"  # what a run sets aside: the records it could not read


def _swallowed(line: str) -> Optional[dict]:
    """The whole record at the end of a torn line: jaxdepth up to f102334 appended a unit's
    row straight after the fragment an interrupted append had left, with no newline."""
    decoder = json.JSONDecoder()
    for i in (m.start() for m in re.finditer(r"\{", line)):
        if i == 0:
            continue
        try:
            row, end = decoder.raw_decode(line, i)
        except json.JSONDecodeError:
            continue
        if end == len(line.rstrip()) and isinstance(row, dict):
            return row
    return None


def _lines(path: Path) -> Iterator[tuple[int, str, Optional[dict]]]:
    """(line number, line, its row: None when not a whole JSON object) of each line of a
    results.jsonl that is not blank."""
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                  .splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        yield lineno, line, row if isinstance(row, dict) else None


def read_results(path: str | Path) -> tuple[list[dict], list[str]]:
    """(rows, unreadable) of an experiment directory or of a results.jsonl file.

    A directory's rows are those of its results.jsonl (experiments of earlier versions
    appended there), then one per ``results/*.json`` in name order. ``unreadable`` names each
    record that is not a whole JSON object (``file:line``, or the file): a write cut short, a
    damaged file; a whole row found after a fragment (a torn line that swallowed the next
    record) is kept. A missing file or directory raises FileNotFoundError naming it.
    """
    path = Path(path)
    if path.is_dir():
        rows, unreadable = ([], []) if not (path / LEGACY_RESULTS).is_file() else read_results(
            path / LEGACY_RESULTS)
        for unit in sorted((path / RESULTS_DIR).glob("*.json")):
            try:
                row = json.loads(unit.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                row = None
            if isinstance(row, dict):
                rows.append(row)
            else:
                unreadable.append(str(unit))
        return rows, unreadable
    if not path.is_file():
        raise FileNotFoundError(f"results not found: {path}")
    rows, unreadable = [], []
    for lineno, line, row in _lines(path):
        if row is None:
            unreadable.append(f"{path}:{lineno}")
            row = _swallowed(line)
        if row is not None:
            rows.append(row)
    return rows, unreadable


def load_rows(path: str | Path) -> list[dict]:
    """The rows of read_results, with one warning line per unreadable record (it is left
    out: its unit counts as not done)."""
    rows, unreadable = read_results(path)
    for where in unreadable:
        warn(f"{where}: not a whole result record (a write cut short?); left out")
    return rows


def set_aside_unreadable(out: Path) -> list[tuple[str, Path]]:
    """Move every unreadable record of experiment directory `out` aside, so that its unit is
    redone and no later record can be read together with it; nothing is deleted. A damaged
    results/<unit>.json goes to <unit>.json.unreadable; the fragments of results.jsonl are
    appended to results.jsonl.unreadable (each after a line naming where it was), and
    results.jsonl is rewritten whole with the readable rows. Returns (what, where to) for
    each record moved."""
    from ..files import write_whole

    moved = []
    legacy = out / LEGACY_RESULTS
    aside = legacy.with_name(legacy.name + UNREADABLE)
    _, unreadable = read_results(out)
    for where in unreadable:
        if not where.startswith(str(legacy) + ":"):
            os.replace(where, where + UNREADABLE)
            moved.append((where, Path(where + UNREADABLE)))
    if any(w.startswith(str(legacy) + ":") for w in unreadable):
        kept, fragments = [], []
        for lineno, line, row in _lines(legacy):
            if row is not None:
                kept.append(line)
                continue
            fragments.append(f"# {legacy.name}:{lineno}\n{line}\n")
            if (row := _swallowed(line)) is not None:
                kept.append(json.dumps(row))
            moved.append((f"{legacy}:{lineno}", aside))
        write_whole(aside, (aside.read_text(encoding="utf-8", errors="replace")
                            if aside.is_file() else "") + "".join(fragments))
        write_whole(legacy, "".join(line + "\n" for line in kept))
    return moved


def dedupe(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Keep, for each RUN_KEY [+ threshold for equal_loss], only the last row; the survivors
    stay at the position of their key's first appearance."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row.get(k) for k in RUN_KEY)
        if row.get("kind") == "equal_loss":
            key += (row.get("threshold"),)
        latest[key] = dict(row)
    return list(latest.values())


# --------------------------------------------------------------------------------------------
# Aggregation


def _sort_key(values: Sequence[Any]) -> tuple:
    # None sorts last; numbers before strings so mixed keys never raise.
    return tuple(
        (v is None, isinstance(v, str), v if v is not None else 0) for v in values
    )


def _matches(row: Mapping[str, Any], where: Optional[Mapping[str, Any]]) -> bool:
    return not where or all(row.get(k) == v for k, v in where.items())


def aggregate(
    rows: Iterable[Mapping[str, Any]],
    kind: str,
    value_key: str,
    by: Sequence[str] = ("depth",),
    where: Optional[Mapping[str, Any]] = None,
) -> list[dict]:
    """Mean and 95% CI over seeds of `value_key` for the rows of `kind`, grouped by `by`.

    Rows are filtered by `where` (equality on each key, e.g. {"task": "cogs", "init": "final"}).
    Each group gives ``{**keys, "n", "mean", "ci95", "values"}``: None values are excluded,
    ``n`` counts the remaining values, ``ci95`` is the half-width (None when n == 1), ``values``
    are ordered by seed. Groups without any value are left out; groups are sorted by their keys.
    Rows are not deduplicated here: pass `dedupe(rows)`.
    """
    groups: dict[tuple, list[tuple[Any, float]]] = {}
    for row in rows:
        if row.get("kind") != kind or not _matches(row, where):
            continue
        value = row.get(value_key)
        if value is None:
            continue
        groups.setdefault(tuple(row.get(k) for k in by), []).append((row.get("seed"), float(value)))
    out = []
    for keys in sorted(groups, key=_sort_key):
        seeded = sorted(groups[keys], key=lambda sv: _sort_key([sv[0]]))
        values = [v for _, v in seeded]
        mean, ci = (values[0], None) if len(values) == 1 else mean_ci95(values)
        out.append({**dict(zip(by, keys)), "n": len(values), "mean": mean, "ci95": ci,
                    "values": values})
    return out


def _index(aggregates: Iterable[dict], by: Sequence[str]) -> dict[tuple, dict]:
    return {tuple(a[k] for k in by): a for a in aggregates}


def _first(rows: Iterable[Mapping[str, Any]], key: str) -> Any:
    return next((r[key] for r in rows if r.get(key) is not None), None)


def size_classes(rows: Iterable[Mapping[str, Any]]) -> list:
    return sorted({r.get("size_class") for r in rows}, key=lambda v: _sort_key([v]))


def tasks(rows: Iterable[Mapping[str, Any]], kind: str = "finetune",
          where: Optional[Mapping[str, Any]] = None) -> list:
    return sorted({r.get("task") for r in rows if r.get("kind") == kind and _matches(r, where)
                   and r.get("task") is not None}, key=str)


def architecture(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, dict]:
    """{(size_class, depth): {"d_model", "d_ff", "params", "ratio"}} from the pretrain rows
    (the first non-None value over seeds; ratio = d_model / d_ff)."""
    by_model: dict[tuple, list] = {}
    for r in rows:
        if r.get("kind") == "pretrain":
            by_model.setdefault((r.get("size_class"), r.get("depth")), []).append(r)
    out = {}
    for key, rs in by_model.items():
        d_model, d_ff = _first(rs, "d_model"), _first(rs, "d_ff")
        ratio = d_model / d_ff if d_model is not None and d_ff else None
        out[key] = {"d_model": d_model, "d_ff": d_ff, "params": _first(rs, "params"),
                    "ratio": ratio}
    return out


def relative_perplexity(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Data of Fig. 3: per (size_class, depth), mean validation perplexity divided by the mean
    validation perplexity of the *shallowest depth of the same size class* that has one.

    Returns dicts ``{"size_class", "depth", "d_model", "d_ff", "ratio" (d_model / d_ff),
    "mean_ppl", "reference_depth", "reference_ppl", "relative_ppl"}`` sorted by size class, depth.
    """
    rows = list(rows)
    ppl = aggregate(rows, "pretrain", "valid_ppl", by=("size_class", "depth"))
    arch = architecture(rows)
    out = []
    for sc in size_classes(rows):
        group = [a for a in ppl if a["size_class"] == sc]
        if not group:
            continue
        ref = group[0]  # sorted by depth: the shallowest
        for a in group:
            info = arch.get((sc, a["depth"]), {})
            out.append({
                "size_class": sc, "depth": a["depth"], "d_model": info.get("d_model"),
                "d_ff": info.get("d_ff"), "ratio": info.get("ratio"), "mean_ppl": a["mean"],
                "reference_depth": ref["depth"], "reference_ppl": ref["mean"],
                "relative_ppl": a["mean"] / ref["mean"],
            })
    return out

