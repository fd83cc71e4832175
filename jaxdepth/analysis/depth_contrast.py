"""Does the deeper model generalize better? The depth sweep's contrast between two depths of
one size class, analysed as declared before the 45-seed sweep's rows were read (issue 48).

For each task and each pair of consecutive depths of the plan (deep - shallow, fine-tuned
from the final pretraining checkpoint):

* **Primary endpoint**: lexical generalization. The difference of means with its 95% Welch
  interval and the 95% interval of the per-seed differences (paired by seed: the same seed
  gives both depths their initialisation key and data order), and an equivalence test at a
  margin of +-10 points fixed in advance (two one-sided Welch tests, TOST; equivalent when the
  90% Welch interval lies inside the margin). One reading: "deeper ahead by X" or "shallower
  ahead by X" when the 95% Welch interval excludes 0; "equal within +-10" when TOST rejects;
  else "inconclusive", with the 90% interval and about how many seeds per depth would decide
  if the observed difference and spread held.
* **Secondary** (Holm-adjusted over the pair's in-distribution and structural contrasts, both
  tasks, and labelled so): the same Welch contrast with Mann-Whitney beside it.
* **Per depth and split**: mean with its 95% t-interval, median with its 95% order-statistic
  interval (scipy's quantile_test; None where n is too small for one).
* **The plateau**: seeds that leave the fine-tuning plateau and seeds that do not. The rule,
  fixed in advance: the antimode of the pooled lexical scores of the pair (both depths, the
  task's seeds): the lowest point of their Gaussian kernel density estimate (Silverman's
  bandwidth, on a grid of 1,001 points over [0, 1]) between its two highest modes; no
  antimode when the estimate has a single mode. Per depth the share of seeds above it with
  its 95% Wilson interval, and Fisher's exact test between the depths.

Accuracies are fractions in [0, 1] in the rows and in the JSON; the Markdown shows points.
No seed is dropped: a unit without a result is missing from its depth's n, which the report
names.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import numpy as np
from scipy import stats

MARGIN = 0.10  # the equivalence margin, +-10 points, fixed before the rows were read
PRIMARY = "lexical"
SECONDARY = ("id_accuracy", "structural")
SPLITS = ("id_accuracy", PRIMARY, "structural")
SPLIT_NAMES = {"id_accuracy": "in distribution", "lexical": "lexical", "structural": "structural"}
GRID = np.linspace(0.0, 1.0, 1001)


def _scores(rows: Iterable[Mapping[str, Any]], size_class, task: str, depth: int,
            split: str) -> dict[int, float]:
    """{seed: score} of the fine-tunings from the final checkpoint (None values left out)."""
    return {r["seed"]: float(r[split]) for r in rows
            if r.get("kind") == "finetune" and r.get("init", "final") == "final"
            and r.get("size_class") == size_class and r.get("task") == task
            and r.get("depth") == depth and r.get(split) is not None}


def _f(x) -> Optional[float]:
    """A statistic as JSON takes it: None where it is undefined (nan: no spread at all)."""
    x = float(x)
    return None if math.isnan(x) else x


def _interval(ci) -> Optional[list[float]]:
    low, high = _f(ci.low), _f(ci.high)
    return None if low is None or high is None else [low, high]


def _quiet(fn):
    """scipy warns on samples without spread (every seed 0% structural, say) and returns
    nan, which _f turns into None: the table shows no number rather than a false one."""
    def wrapped(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)
    return wrapped


@_quiet
def per_depth(values: list[float]) -> dict:
    """n, mean with its 95% t-interval, median with its 95% order-statistic interval."""
    x = np.asarray(values, dtype=np.float64)
    out = {"n": len(x), "mean": float(x.mean()) if len(x) else None, "mean_ci95": None,
           "median": float(np.median(x)) if len(x) else None, "median_ci95": None}
    if len(x) >= 2:
        sem = stats.sem(x)
        half = float(stats.t.ppf(0.975, len(x) - 1) * sem)
        out["mean_ci95"] = [out["mean"] - half, out["mean"] + half]
        out["median_ci95"] = _interval(stats.quantile_test(x, p=0.5).confidence_interval(0.95))
    return out


@_quiet
def contrast(deep: dict[int, float], shallow: dict[int, float]) -> dict:
    """deep - shallow: Welch (95% and 90% intervals), paired by seed, Mann-Whitney, TOST at
    MARGIN, and the reading. Needs at least two seeds at each depth."""
    a, b = (np.asarray(list(v.values()), dtype=np.float64) for v in (deep, shallow))
    welch = stats.ttest_ind(a, b, equal_var=False)
    diff = float(a.mean() - b.mean())
    ci95, ci90 = (_interval(welch.confidence_interval(c)) for c in (0.95, 0.90))
    common = sorted(set(deep) & set(shallow))
    paired = None
    if len(common) >= 2:
        d = np.array([deep[s] - shallow[s] for s in common])
        rel = stats.ttest_rel([deep[s] for s in common], [shallow[s] for s in common])
        paired = {"n": len(common), "diff": float(d.mean()), "p": _f(rel.pvalue),
                  "ci95": _interval(rel.confidence_interval(0.95))}
    # TOST: H0 diff <= -MARGIN (shift the shallow scores down by the margin) and H0 diff >= MARGIN
    lower = stats.ttest_ind(a, b - MARGIN, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(a, b + MARGIN, equal_var=False, alternative="less").pvalue
    mw = stats.mannwhitneyu(a, b, alternative="two-sided")
    out = {"n_deep": len(a), "n_shallow": len(b), "mean_deep": float(a.mean()),
           "mean_shallow": float(b.mean()), "diff": diff,
           "welch": {"t": _f(welch.statistic), "df": _f(welch.df),
                     "p": _f(welch.pvalue), "ci95": ci95, "ci90": ci90},
           "paired": paired, "mann_whitney": {"U": float(mw.statistic), "p": _f(mw.pvalue)},
           "tost_p": _f(max(lower, upper))}
    out["seeds_to_decide"] = _seeds_to_decide(a, b, diff)
    return out


def _seeds_to_decide(a: np.ndarray, b: np.ndarray, diff: float) -> Optional[int]:
    """The fewest seeds per depth at which the observed difference and spread would decide:
    the 95% Welch interval excluding 0, or the 90% interval inside the margin (equal n and
    variances: half-width t(2n - 2) * s * sqrt(2 / n), s the pooled standard deviation)."""
    s = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2)
    if s == 0:
        return None
    for n in range(2, 100_001):
        half = s * math.sqrt(2 / n)
        if ((diff != 0 and stats.t.ppf(0.975, 2 * n - 2) * half < abs(diff))
                or stats.t.ppf(0.95, 2 * n - 2) * half < MARGIN - abs(diff)):
            return n
    return None


def reading(c: dict, deep: int, shallow: int) -> str:
    """The declared reading of a primary contrast, in points."""
    pts = lambda v: f"{100 * v:.1f}"  # noqa: E731
    if c["welch"]["ci95"] is None:
        return "no spread at either depth: no interval"
    lo95, hi95 = c["welch"]["ci95"]
    lo90, hi90 = c["welch"]["ci90"]
    parts = []
    if lo95 > 0 or hi95 < 0:
        ahead = deep if c["diff"] > 0 else shallow
        parts.append(f"{ahead} layers ahead by {pts(abs(c['diff']))} points (95% interval "
                     f"[{pts(lo95)}, {pts(hi95)}])")
    if c["tost_p"] is not None and c["tost_p"] < 0.05:
        parts.append(f"equal within +-{pts(MARGIN)} points (TOST p = {c['tost_p']:.3f}; 90% "
                     f"interval [{pts(lo90)}, {pts(hi90)}])")
    if parts:
        return "; ".join(parts)
    n = c["seeds_to_decide"]
    return (f"inconclusive: 90% interval [{pts(lo90)}, {pts(hi90)}]"
            + (f"; about {n} seeds per depth would decide" if n else ""))


def antimode(values: list[float]) -> Optional[float]:
    """The plateau threshold (the rule in the module's docstring), or None (one mode, or a
    single value: no density to estimate)."""
    x = np.asarray(values, dtype=np.float64)
    if len(np.unique(x)) < 2:
        return None
    density = stats.gaussian_kde(x, bw_method="silverman")(GRID)
    inner = np.arange(1, len(GRID) - 1)
    peaks = inner[(density[inner] > density[inner - 1]) & (density[inner] >= density[inner + 1])]
    if len(peaks) < 2:
        return None
    two = np.sort(peaks[np.argsort(density[peaks])[-2:]])
    between = np.arange(two[0], two[1] + 1)
    return float(GRID[between[np.argmin(density[between])]])


def plateau(deep: dict[int, float], shallow: dict[int, float], depths: tuple[int, int]) -> dict:
    """The antimode of the pooled scores, the share above it per depth (Wilson 95%) and
    Fisher's exact test between the depths."""
    threshold = antimode([*deep.values(), *shallow.values()])
    out = {"threshold": threshold, "depths": {}, "fisher_p": None}
    if threshold is None:
        return out
    table = []
    for depth, scores in zip(depths, (deep, shallow)):
        above = sum(v > threshold for v in scores.values())
        ci = stats.binomtest(above, len(scores)).proportion_ci(0.95, method="wilson")
        out["depths"][depth] = {"n": len(scores), "above": above,
                                "share": above / len(scores), "wilson95": _interval(ci)}
        table.append([above, len(scores) - above])
    out["fisher_p"] = float(stats.fisher_exact(table).pvalue)
    return out


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment, in the order given."""
    order = np.argsort(pvalues)
    m, out, running = len(pvalues), [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def analyse(rows: Iterable[Mapping[str, Any]]) -> dict:
    """Every contrast of consecutive depths of every size class (the module's docstring)."""
    rows = [r for r in rows if r.get("kind") == "finetune"]
    out: dict[str, list] = {"per_depth": [], "contrasts": [], "plateau": []}
    for size_class in sorted({r.get("size_class") for r in rows}, key=str):
        sc = [r for r in rows if r.get("size_class") == size_class]
        tasks = sorted({r["task"] for r in sc})
        depths = sorted({r["depth"] for r in sc if r.get("init", "final") == "final"})
        for task in tasks:
            for depth in depths:
                for split in SPLITS:
                    v = _scores(sc, size_class, task, depth, split)
                    if v:
                        out["per_depth"].append({"size_class": size_class, "task": task,
                                                 "depth": depth, "split": split,
                                                 **per_depth(list(v.values()))})
        for shallow, deep in zip(depths, depths[1:]):
            secondary = []
            for task in tasks:
                for split in SPLITS:
                    hi, lo = (_scores(sc, size_class, task, d, split) for d in (deep, shallow))
                    if min(len(hi), len(lo)) < 2:
                        continue
                    c = {"size_class": size_class, "task": task, "deep": deep,
                         "shallow": shallow, "split": split,
                         "role": "primary" if split == PRIMARY else "secondary",
                         **contrast(hi, lo)}
                    if split == PRIMARY:
                        c["reading"] = reading(c, deep, shallow)
                        out["plateau"].append({"size_class": size_class, "task": task,
                                               "deep": deep, "shallow": shallow,
                                               **plateau(hi, lo, (deep, shallow))})
                    else:
                        secondary.append(c)
                    out["contrasts"].append(c)
            tested = [c for c in secondary if c["welch"]["p"] is not None]
            for c, p in zip(tested, holm([c["welch"]["p"] for c in tested])):
                c["holm_p"] = p
    return out


def _pts(v: Optional[float]) -> str:
    return "" if v is None else f"{100 * v:.1f}"


def _p(p: Optional[float]) -> str:
    return "" if p is None else f"{p:.3g}"


def _span(ci: Optional[list[float]]) -> str:
    return "" if ci is None else f"[{_pts(ci[0])}, {_pts(ci[1])}]"


def markdown(result: dict) -> str:
    """The contrasts, the plateau and the per-depth summaries as Markdown (points)."""
    lines = ["Contrasts of depth (deep - shallow), fine-tuned from the final checkpoint; "
             f"points; equivalence margin +-{_pts(MARGIN)}. Primary: lexical generalization. "
             "Secondary p-values Holm-adjusted over the pair's in-distribution and structural "
             "contrasts.", "",
             "| size class | task | depths | split | role | n | diff | Welch 95% | Welch p | "
             "paired 95% | Mann-Whitney p | TOST p | Holm p | reading |",
             "|:---|:---|---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for c in result["contrasts"]:
        paired = c["paired"]
        lines.append(
            f"| {c['size_class']} | {c['task']} | {c['deep']} - {c['shallow']} | "
            f"{SPLIT_NAMES[c['split']]} | {c['role']} | {c['n_deep']}, {c['n_shallow']} | "
            f"{_pts(c['diff'])} | {_span(c['welch']['ci95'])} | {_p(c['welch']['p'])} | "
            f"{_span(paired['ci95']) if paired else ''} | {_p(c['mann_whitney']['p'])} | "
            f"{_p(c['tost_p'])} | {_p(c.get('holm_p'))} | {c.get('reading', '')} |")
    lines += ["", "The plateau: the antimode of the pooled lexical scores (Gaussian KDE, "
              "Silverman's bandwidth); per depth the seeds above it (Wilson 95%), Fisher's "
              "exact test between depths.", "",
              "| size class | task | depths | threshold | deep above | shallow above | "
              "Fisher p |", "|:---|:---|---:|---:|---:|---:|---:|"]
    for p in result["plateau"]:
        if p["threshold"] is None:
            lines.append(f"| {p['size_class']} | {p['task']} | {p['deep']} - {p['shallow']} | "
                         f"one mode: no threshold | | | |")
            continue
        cells = []
        for depth in (p["deep"], p["shallow"]):
            d = p["depths"][depth]
            cells.append(f"{d['above']}/{d['n']} = {_pts(d['share'])}% "
                         f"{_span(d['wilson95'])}")
        lines.append(f"| {p['size_class']} | {p['task']} | {p['deep']} - {p['shallow']} | "
                     f"{_pts(p['threshold'])} | {cells[0]} | {cells[1]} | "
                     f"{p['fisher_p']:.3g} |")
    lines += ["", "Per depth: mean (95% t-interval), median (95% order-statistic interval).",
              "", "| size class | task | depth | split | n | mean | 95% | median | 95% |",
              "|:---|:---|---:|:---|---:|---:|---:|---:|---:|"]
    for d in result["per_depth"]:
        lines.append(f"| {d['size_class']} | {d['task']} | {d['depth']} | "
                     f"{SPLIT_NAMES[d['split']]} | {d['n']} | {_pts(d['mean'])} | "
                     f"{_span(d['mean_ci95'])} | {_pts(d['median'])} | "
                     f"{_span(d['median_ci95'])} |")
    return "\n".join(lines) + "\n"
