"""Tables and figures of the few-shot fusion experiment (experiments/fusion_fewshot.py).

Rows are the experiment's results: one per (method, mode, n_shot, trial) with ``test_f1`` (at
the best dev point), ``best_dev_f1`` and the dev/test ``curve``. Aggregates are the mean and
95% t-interval over trials (`exact_match.mean_ci95`); F1 is reported in percent.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import FUSION_MODES
from ..models.fusions import fusion_methods
from .plots import plt, save_png
from .report import _csv, _fmt, _markdown, aggregate

METHOD_ORDER = fusion_methods()
MODE_ORDER = tuple(FUSION_MODES)


def _mode_label(mode: str) -> str:
    return FUSION_MODES.get(mode, mode)


def _ordered(values, order) -> list:
    return sorted(set(values), key=lambda v: (order.index(v) if v in order else len(order), v))


def table(rows: Sequence[Mapping[str, Any]], value_key: str = "test_f1") -> tuple[str, str]:
    """(markdown, csv): method x mode rows, N-shot columns, mean ± 95% CI of value_key."""
    aggs = {(a["method"], a["mode"], a["n_shot"]): a
            for a in aggregate(rows, "ner", value_key, by=("method", "mode", "n_shot"))}
    shots = sorted({r["n_shot"] for r in rows})
    methods = _ordered([r["method"] for r in rows], METHOD_ORDER)
    modes = _ordered([r["mode"] for r in rows], MODE_ORDER)
    header = ["mode", "method"] + [f"N={n}" for n in shots]
    md, csv = [], []
    for mode in modes:
        for m in methods:
            cells = [aggs.get((m, mode, n)) for n in shots]
            md.append([mode.upper(), m]
                      + [_fmt(a["mean"], a["ci95"], 100.0) if a else "" for a in cells])
            csv.append([mode, m] + [f"{100 * a['mean']:.2f}" if a else "" for a in cells])
    trials = sorted({r["seed"] for r in rows})
    what = "test F1 at the best dev point" if value_key == "test_f1" else "best dev F1"
    caption = (f"Few-shot NER, {what} (%, mean ± 95% CI over {len(trials)} trials); "
               f"N * C training sentences.")
    return _markdown(header, md, caption), _csv(["mode", "method"] + [str(n) for n in shots], csv)


def f1_vs_shots(rows: Sequence[Mapping[str, Any]], path: str | Path) -> tuple[Path, dict]:
    """Fig. 3: test F1 against N-shot, one line per method, one panel per mode."""
    modes = _ordered([r["mode"] for r in rows], MODE_ORDER)
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.8), squeeze=False)
    series = {}
    for ax, mode in zip(axes[0], modes):
        for a_m in _ordered([r["method"] for r in rows], METHOD_ORDER):
            aggs = aggregate(rows, "ner", "test_f1", by=("n_shot",),
                             where={"method": a_m, "mode": mode})
            x = [a["n_shot"] for a in aggs]
            y = [100 * a["mean"] for a in aggs]
            err = [100 * (a["ci95"] or 0.0) for a in aggs]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=a_m)
            series[f"{mode}/{a_m}"] = {"x": x, "mean": y, "ci95": err}
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N-shot (N * C sentences)")
        ax.set_ylabel("test F1 (%)")
        ax.set_title(_mode_label(mode))
        ax.legend(fontsize=8)
    return save_png(fig, path), series


def f1_vs_step(rows: Sequence[Mapping[str, Any]], path: str | Path,
               n_shot: int | None = None) -> tuple[Path, dict]:
    """Fig. 4: dev F1 against the training step at one N-shot (default: the largest), mean
    over trials, one line per method, one panel per mode."""
    n_shot = n_shot or max(r["n_shot"] for r in rows)
    modes = _ordered([r["mode"] for r in rows], MODE_ORDER)
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.8), squeeze=False)
    series = {}
    for ax, mode in zip(axes[0], modes):
        for m in _ordered([r["method"] for r in rows], METHOD_ORDER):
            curves = [r["curve"] for r in rows
                      if r["method"] == m and r["mode"] == mode and r["n_shot"] == n_shot]
            if not curves:
                continue
            steps = sorted(set.intersection(*({c[0] for c in cur} for cur in curves)))
            mean = [100 * float(np.mean([dict((c[0], c[1]) for c in cur)[s] for cur in curves]))
                    for s in steps]
            ax.plot(steps, mean, marker=".", label=m)
            series[f"{mode}/{m}"] = {"x": steps, "mean": mean, "n": len(curves)}
        ax.set_xlabel("training step")
        ax.set_ylabel("dev F1 (%)")
        ax.set_title(f"{_mode_label(mode)}, N={n_shot}")
        ax.legend(fontsize=8)
    return save_png(fig, path), series


def write_report(rows: Sequence[Mapping[str, Any]], out: str | Path) -> dict[str, Path]:
    if not rows:
        raise FileNotFoundError("no finished units to report (no result in results/)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key, name in (("test_f1", "table_test_f1"), ("best_dev_f1", "table_dev_f1")):
        md, csv = table(rows, key)
        (out / f"{name}.md").write_text(md)
        (out / f"{name}.csv").write_text(csv)
        paths[name] = out / f"{name}.md"
    paths["fig3"], _ = f1_vs_shots(rows, out / "fig3_f1_vs_shots.png")
    paths["fig4"], _ = f1_vs_step(rows, out / "fig4_f1_vs_step.png")
    return paths
