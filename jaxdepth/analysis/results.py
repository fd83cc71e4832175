"""The depth sweep's results.jsonl as rows: reading, de-duplicating, aggregating over seeds.

Shared by the tables (report.py) and the figures (plots.py); the row format is described in
report.py.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from jaxdepth.analysis.exact_match import mean_ci95

KINDS = ("pretrain", "finetune", "equal_loss")
# Identity of a run: a later row with the same identity replaces an earlier one. equal_loss rows
# are additionally keyed by `threshold`, so a sweep that logs several thresholds keeps them all.
RUN_KEY = ("kind", "size_class", "depth", "seed", "task", "init")


# --------------------------------------------------------------------------------------------
# Loading


def load_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL results file, in file order.

    Blank lines are skipped. A final line that does not parse (torn by an interrupted append) is
    ignored with a warning; a bad line anywhere else raises ValueError naming ``file:line``.
    A missing file raises FileNotFoundError naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows: list[dict] = []
    for k, (lineno, line) in enumerate(numbered):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if k == len(numbered) - 1:
                warnings.warn(f"{path}:{lineno}: ignoring torn final line", stacklevel=2)
                break
            raise ValueError(f"{path}:{lineno}: invalid JSON: {e}") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _run_key(row: Mapping[str, Any]) -> tuple:
    key = tuple(row.get(k) for k in RUN_KEY)
    if row.get("kind") == "equal_loss":
        key += (row.get("threshold"),)
    return key


def dedupe(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Keep, for each (kind, size_class, depth, seed, task, init) [+ threshold for equal_loss],
    only the last row; the survivors stay at the position of their key's first appearance."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        latest[_run_key(row)] = dict(row)
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


def _summary(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    if not values:
        return None, None
    if len(values) == 1:
        return float(values[0]), None
    return mean_ci95(values)


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
        mean, ci = _summary(values)
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


# --------------------------------------------------------------------------------------------
# Formatting
