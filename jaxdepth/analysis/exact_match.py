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


# Two-sided 95% quantiles of Student's t, t_{0.975}(df) (standard tables, 6 decimals). scipy
# is not a dependency; tests check every entry against the CDF computed with betainc.
T_975 = {
    1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 6: 2.446912,
    7: 2.364624, 8: 2.306004, 9: 2.262157, 10: 2.228139, 11: 2.200985, 12: 2.178813,
    13: 2.160369, 14: 2.144787, 15: 2.131450, 16: 2.119905, 17: 2.109816, 18: 2.100922,
    19: 2.093024, 20: 2.085963, 21: 2.079614, 22: 2.073873, 23: 2.068658, 24: 2.063899,
    25: 2.059539, 26: 2.055529, 27: 2.051831, 28: 2.048407, 29: 2.045230, 30: 2.042272,
    40: 2.021075, 50: 2.008559, 60: 2.000298, 80: 1.990063, 100: 1.983972, 120: 1.979930,
}
Z_975 = 1.959964  # the df -> infinity limit


def t_quantile_975(df: int) -> float:
    """t_{0.975}(df): exact from the table for df <= 30 and the listed larger df; in between,
    linear in 1/df (error < 1e-4); beyond 120, interpolated towards the normal quantile."""
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be an int >= 1, got {df!r}")
    if df in T_975:
        return T_975[df]
    keys = sorted(T_975)
    lo = max(k for k in keys if k < df)
    hi = min((k for k in keys if k > df), default=None)
    q_lo, inv_lo = T_975[lo], 1.0 / lo
    q_hi, inv_hi = (T_975[hi], 1.0 / hi) if hi is not None else (Z_975, 0.0)
    w = (1.0 / df - inv_hi) / (inv_lo - inv_hi)
    return q_hi + w * (q_lo - q_hi)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width) of the 95% t confidence interval of the mean of `values` (e.g. one
    accuracy per seed): half-width = t_{0.975}(n-1) * s / sqrt(n), s the sample std (n-1)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 values, got {n}")
    mean = sum(xs) / n
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t_quantile_975(n - 1) * s / math.sqrt(n)
