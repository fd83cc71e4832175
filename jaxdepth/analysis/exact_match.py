"""Exact-match accuracy, per generalization type, and confidence intervals over seeds.

Exact match compares whole whitespace-token sequences: one wrong, missing or extra token
anywhere (the final one included) makes the prediction wrong. Whitespace differences alone
(double spaces, a trailing newline from decoding) do not, since COGS, GeoQuery and
passivization targets are all space-tokenized.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from scipy import stats

from jaxdepth.data.finetune.seq2seq_readers import (IN_DISTRIBUTION_TYPES, STRUCTURAL_TYPES,
                                                    is_generalization_type)


def exact_match(prediction: str, gold: str) -> bool:
    return prediction.split() == gold.split()


def _field(record: Any, name: str) -> Any:
    # Records may be dicts (from JSON logs) or objects (dataclasses, namedtuples).
    return record[name] if isinstance(record, Mapping) else getattr(record, name)


def _mean(hits: Sequence[bool]) -> Optional[float]:
    return sum(hits) / len(hits) if hits else None


def accuracy_by_type(records: Iterable[Any]) -> dict[str, Any]:
    """Accuracy of records with fields `type` and `correct` (bool).

    Returns {"overall", "n", "by_type", "count_by_type", "in_distribution", "lexical",
    "structural"}. Aggregates pool examples (with COGS's 1000 per type this equals the mean of
    the per-type accuracies): structural = STRUCTURAL_TYPES, lexical = every other
    generalization type, in_distribution = IN_DISTRIBUTION_TYPES. Training-only types
    (primitive, exposure_example_*) count in `overall` and `by_type` but in no aggregate.
    An aggregate with no records is None.
    """
    hits_by_type: dict[str, list[bool]] = {}
    for r in records:
        hits_by_type.setdefault(str(_field(r, "type")), []).append(bool(_field(r, "correct")))
    groups: dict[str, list[bool]] = {"in_distribution": [], "lexical": [], "structural": []}
    for t, hits in hits_by_type.items():
        if t in IN_DISTRIBUTION_TYPES:
            groups["in_distribution"] += hits
        elif t in STRUCTURAL_TYPES:
            groups["structural"] += hits
        elif is_generalization_type(t):
            groups["lexical"] += hits
    everything = [h for hits in hits_by_type.values() for h in hits]
    return {
        "overall": _mean(everything),
        "n": len(everything),
        "by_type": {t: _mean(h) for t, h in sorted(hits_by_type.items())},
        "count_by_type": {t: len(h) for t, h in sorted(hits_by_type.items())},
        **{name: _mean(hits) for name, hits in groups.items()},
    }


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width) of the 95% t confidence interval of the mean of `values` (e.g. one
    accuracy per seed): half-width = t_{0.975}(n-1) * s / sqrt(n), s the sample std (n-1)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 values, got {n}")
    mean = sum(xs) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * s / math.sqrt(n)
