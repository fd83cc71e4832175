"""Figures 2-7 of Petty et al. from the depth sweep's result rows (see `report`).

Every function takes the (deduplicated) rows, an output path and optionally the size class
(needed only when the rows hold several), writes a PNG and returns ``(path, series)``:
`series` holds exactly what was plotted, as aggregates of `results.aggregate` reduced to
``{"x": [...], "mean": [...], "ci95": [...], "n": [...]}`` (ci95 None for a single seed; drawn
without an error bar). Accuracies are fractions in [0, 1].
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jaxdepth.analysis.results import (  # noqa: E402
    aggregate, relative_perplexity as _relative_perplexity)
from jaxdepth.analysis.results import size_classes, tasks  # noqa: E402

DPI = 120


def _select(rows: Iterable[Mapping[str, Any]], size_class: Optional[str]) -> tuple[list, Any]:
    rows = list(rows)
    if size_class is None:
        classes = size_classes(rows)
        if len(classes) > 1:
            raise ValueError(f"rows hold several size classes {classes}: pass size_class")
        size_class = classes[0] if classes else None
    return [r for r in rows if r.get("size_class") == size_class], size_class


def _series(aggs: Sequence[dict], x_key: str = "depth") -> dict:
    return {"x": [a[x_key] for a in aggs], "mean": [a["mean"] for a in aggs],
            "ci95": [a["ci95"] for a in aggs], "n": [a["n"] for a in aggs]}


def _seeds(rows: Iterable[Mapping[str, Any]], kind: str) -> str:
    seeds = {r.get("seed") for r in rows if r.get("kind") == kind}
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"


def _errorbar(ax, s: dict, label: Optional[str] = None, **kw) -> None:
    yerr = [0.0 if c is None else c for c in s["ci95"]]
    ax.errorbar(s["x"], s["mean"], yerr=yerr, marker="o", capsize=3, label=label, **kw)


def _depth_axis(ax, depths: Iterable) -> None:
    depths = sorted({d for d in depths if d is not None})
    if depths:
        ax.set_xticks(depths)
    ax.set_xlabel("depth (layers)")
    ax.grid(alpha=0.3)


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes)


def _lines_vs_depth(series: Mapping[str, dict], missing: str):
    """One accuracy-vs-depth panel, a line with CI bars per labelled series."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in series.items():
        _errorbar(ax, s, label=label)
    if series:
        ax.legend(title="task")
    else:
        _no_data(ax, missing)
    _depth_axis(ax, [x for s in series.values() for x in s["x"]])
    ax.set_ylabel("generalization accuracy")
    return fig, ax


def save_png(fig, path: str | Path) -> Path:
    """The figure as a PNG at `path` (its folder made), then closed, written or not."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:  # pyplot keeps every open figure: a long run would hold each failed one
        plt.close(fig)
    return path


def perplexity_vs_depth(rows, path, size_class=None) -> tuple[Path, dict]:
    """Fig. 2: validation perplexity (mean, 95% CI over seeds) vs depth.
    Series: {"valid_ppl": {x, mean, ci95, n}}."""
    rows, sc = _select(rows, size_class)
    s = _series(aggregate(rows, "pretrain", "valid_ppl"))
    fig, ax = plt.subplots(figsize=(5, 4))
    _errorbar(ax, s)
    if not s["x"]:
        _no_data(ax, "pretraining rows")
    _depth_axis(ax, s["x"])
    ax.set_ylabel("validation perplexity")
    ax.set_title(f"Validation perplexity vs depth\n({sc}, {_seeds(rows, 'pretrain')}, 95% CI)")
    return save_png(fig, path), {"valid_ppl": s}


def relative_perplexity(rows, path, size_class=None) -> tuple[Path, dict]:
    """Fig. 3: perplexity relative to the shallowest depth, vs depth (left) and vs
    d_model/d_ff (right). Series: {"vs_depth": {x, y}, "vs_ratio": {x, y, depth}}."""
    rows, sc = _select(rows, size_class)
    rel = _relative_perplexity(rows)
    series = {
        "vs_depth": {"x": [r["depth"] for r in rel], "y": [r["relative_ppl"] for r in rel]},
        "vs_ratio": {"x": [r["ratio"] for r in rel], "y": [r["relative_ppl"] for r in rel],
                     "depth": [r["depth"] for r in rel]},
    }
    ref = rel[0]["reference_depth"] if rel else None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
    a1.plot(series["vs_depth"]["x"], series["vs_depth"]["y"], marker="o")
    _depth_axis(a1, series["vs_depth"]["x"])
    a1.set_ylabel(f"perplexity / perplexity at depth {ref}")
    a1.set_title("vs depth")
    pts = [(x, y, d) for x, y, d in zip(*series["vs_ratio"].values()) if x is not None]
    a2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    for x, y, d in pts:
        a2.annotate(f"L={d}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a2.set_xlabel("d_model / d_ff")
    a2.set_ylabel(f"perplexity / perplexity at depth {ref}")
    a2.set_title("vs feed-forward ratio")
    a2.grid(alpha=0.3)
    for ax in (a1, a2):
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        if not rel:
            _no_data(ax, "pretraining rows")
    fig.suptitle(f"Relative validation perplexity ({sc}, {_seeds(rows, 'pretrain')})")
    return save_png(fig, path), series


def _gen_by_task(rows, init: str, value_key: str = "gen_accuracy") -> dict:
    return {t: _series(aggregate(rows, "finetune", value_key, where={"task": t, "init": init}))
            for t in tasks(rows, "finetune", {"init": init})}


def generalization_vs_depth(rows, path, size_class=None, init: str = "final"
                            ) -> tuple[Path, dict]:
    """Fig. 4: generalization accuracy vs depth, one line per task (models fine-tuned from the
    `init` checkpoint). Series: {task: {x, mean, ci95, n}}."""
    rows, sc = _select(rows, size_class)
    series = {t: s for t, s in _gen_by_task(rows, init).items() if s["x"]}
    fig, ax = _lines_vs_depth(series, "fine-tuning rows")
    ax.set_title(f"Generalization accuracy vs depth\n({sc}, init={init}, "
                 f"{_seeds(rows, 'finetune')}, 95% CI)")
    return save_png(fig, path), series


def lexical_vs_structural(rows, path, size_class=None, init: str = "final"
                          ) -> tuple[Path, dict]:
    """Fig. 5: per task (one subplot each), lexical and structural generalization accuracy vs
    depth. Tasks without either split (e.g. GeoQuery) are left out.
    Series: {task: {"lexical": {...}, "structural": {...}}}."""
    rows, sc = _select(rows, size_class)
    series = {}
    for t in tasks(rows, "finetune", {"init": init}):
        parts = {k: _series(aggregate(rows, "finetune", k, where={"task": t, "init": init}))
                 for k in ("lexical", "structural")}
        parts = {k: s for k, s in parts.items() if s["x"]}
        if parts:
            series[t] = parts
    n = max(1, len(series))
    fig, axes = plt.subplots(1, n, figsize=(max(6.0, 4.5 * n), 4.3), squeeze=False)
    for ax, (t, parts) in zip(axes[0], series.items()):
        for k, s in parts.items():
            _errorbar(ax, s, label=k)
        ax.legend()
        ax.set_title(t)
        ax.set_ylabel("accuracy")
        _depth_axis(ax, [x for s in parts.values() for x in s["x"]])
    if not series:
        _no_data(axes[0][0], "lexical/structural results")
    fig.suptitle(f"Lexical vs structural generalization\n({sc}, init={init}, "
                 f"{_seeds(rows, 'finetune')}, 95% CI)")
    return save_png(fig, path), series


def matched_generalization(rows, path, size_class=None, overlay_final: bool = True
                           ) -> tuple[Path, dict]:
    """Fig. 6: generalization accuracy vs depth of models fine-tuned from the perplexity-matched
    checkpoint (solid), optionally with the final-checkpoint models (dashed).
    Series: {task: {"matched": {...}, "final": {...}}} ("final" only with overlay_final)."""
    rows, sc = _select(rows, size_class)
    matched = _gen_by_task(rows, "matched")
    final = _gen_by_task(rows, "final") if overlay_final else {}
    series = {t: {"matched": s} for t, s in matched.items() if s["x"]}
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (t, parts) in enumerate(series.items()):
        color = colors[i % len(colors)]
        _errorbar(ax, parts["matched"], label=f"{t} (matched)", color=color)
        if final.get(t, {}).get("x"):
            parts["final"] = final[t]
            _errorbar(ax, final[t], label=f"{t} (final)", color=color, ls="--", alpha=0.6)
    if series:
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "perplexity-matched rows")
    _depth_axis(ax, [x for p in series.values() for s in p.values() for x in s["x"]])
    ax.set_ylabel("generalization accuracy")
    ax.set_title(f"Generalization at matched perplexity vs depth\n({sc}, 95% CI)")
    return save_png(fig, path), series


def equal_loss_generalization(rows, path, size_class=None) -> tuple[Path, dict]:
    """Fig. 7b: generalization accuracy at equal in-distribution loss vs depth, one line per
    task (and threshold, when several): rows whose step is None (threshold never reached) are
    skipped. Series: {task: {...}} or {"task@threshold": {...}} with several thresholds."""
    rows, sc = _select(rows, size_class)
    reached = [r for r in rows if r.get("kind") == "equal_loss" and r.get("step") is not None]
    thresholds = sorted({r.get("threshold") for r in rows if r.get("kind") == "equal_loss"},
                        key=lambda v: (v is None, v or 0))
    series = {}
    for t in tasks(rows, "equal_loss"):
        for thr in thresholds:
            s = _series(aggregate(reached, "equal_loss", "gen_accuracy",
                                  where={"task": t, "threshold": thr}))
            if s["x"]:
                series[t if len(thresholds) == 1 else f"{t}@{thr}"] = s
    fig, ax = _lines_vs_depth(series, "equal-loss rows that reached the threshold")
    thr_text = ", ".join(str(t) for t in thresholds)
    ax.set_title(f"Generalization at equal ID loss (≤ {thr_text}) vs depth\n({sc}, 95% CI)")
    return save_png(fig, path), series


def every_seed(rows, path, size_class=None, init: str = "final") -> tuple[Path, dict]:
    """Every seed's score, per task (one panel each), split (in distribution, lexical,
    structural) and depth, as a strip with the mean marked: the spread and any plateau a mean
    hides. Series: {task: {split: {depth: [score by seed order]}}}."""
    rows, sc = _select(rows, size_class)
    splits = {"id_accuracy": "in distribution", "lexical": "lexical", "structural": "structural"}
    series: dict = {}
    for t in tasks(rows, "finetune", {"init": init}):
        for k in splits:
            for a in aggregate(rows, "finetune", k, where={"task": t, "init": init}):
                series.setdefault(t, {}).setdefault(k, {})[a["depth"]] = a["values"]
    n = max(1, len(series))
    fig, axes = plt.subplots(1, n, figsize=(max(6.0, 5.0 * n), 4.5), squeeze=False)
    rng = np.random.default_rng(0)  # the jitter only: the same picture every time
    for ax, (t, parts) in zip(axes[0], series.items()):
        depths = sorted({d for by_depth in parts.values() for d in by_depth})
        width = 0.8 / max(1, len(depths))
        for i, k in enumerate(splits):
            for j, d in enumerate(depths):
                values = parts.get(k, {}).get(d, [])
                x = i + (j - (len(depths) - 1) / 2) * width
                ax.scatter(x + rng.uniform(-0.3, 0.3, len(values)) * width, values, s=10,
                           alpha=0.6, color=f"C{j}", label=f"{d} layers" if i == 0 else None)
                if values:
                    ax.hlines(np.mean(values), x - width / 2.5, x + width / 2.5, color="k")
        ax.set_xticks(range(len(splits)))
        ax.set_xticklabels(list(splits.values()))
        ax.set_ylabel("exact-match accuracy")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(t)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    if not series:
        _no_data(axes[0][0], "fine-tuning rows")
    fig.suptitle(f"Every seed ({sc}, init={init}, {_seeds(rows, 'finetune')}; bar: mean)")
    return save_png(fig, path), series
