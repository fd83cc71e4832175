"""Which checkpoint, and which evaluation point, to compare across depths (Figs. 6 and 7b).

Petty et al. compare models of different depths in two matched ways:

* perplexity-matched checkpoints (Fig. 6): a deeper model usually reaches a lower validation
  perplexity, so it is fine-tuned from its *first saved* checkpoint whose perplexity is no
  worse than the shallowest model's final one; better-than-needed or unsaved steps would
  give the deep model an advantage the comparison is meant to remove;
* equal in-distribution loss (Fig. 7b): generalization accuracy is read at the first
  evaluation where each run's dev loss reaches a threshold every run reaches.

Logs are JSONL. A resumed run may log a step twice (the later line is the one that
describes the saved state), a crash can tear the last line, and training and evaluation
rows share one file, so readers must tolerate all three.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional


def _by_step(rows: Iterable[Mapping], key: str) -> dict[int, Mapping]:
    """step -> last row having both a step and key (later lines win after a resume)."""
    return {int(row["step"]): row for row in rows if "step" in row and row.get(key) is not None}


def curve(rows: Iterable[Mapping], key: str) -> list[tuple[int, float]]:
    """[(step, value)] sorted by step, one per step (the later row wins)."""
    by_step = _by_step(rows, key)
    return [(s, float(by_step[s][key])) for s in sorted(by_step)]


def matched_checkpoint(reference_ppl: float, ppl_curve: Sequence[tuple[int, float]],
                       saved_steps: Iterable[int]) -> Optional[int]:
    """First saved step whose recorded perplexity is <= reference_ppl; None if none reaches it.

    Saved steps without a recorded perplexity are skipped: we cannot tell they qualify.
    """
    ppl_at = dict(ppl_curve)
    for step in sorted(saved_steps):
        if step in ppl_at and ppl_at[step] <= reference_ppl:
            return step
    return None


def perplexity_matched(runs: Mapping[int, Mapping], reference_depth: Optional[int] = None,
                       ppl_key: str = "valid_ppl") -> dict:
    """Perplexity-matched checkpoint per depth.

    runs: depth -> {"metrics_rows": rows of metrics.jsonl, "saved_steps": checkpoint steps}.
    The reference is the final validation perplexity of reference_depth (default: the
    shallowest); the reference run itself maps to its final logged step.
    """
    if not runs:
        raise ValueError("no runs given")
    ref = min(runs) if reference_depth is None else reference_depth
    if ref not in runs:
        raise ValueError(f"reference depth {ref} not among runs {sorted(runs)}")
    ref_curve = curve(runs[ref]["metrics_rows"], ppl_key)
    if not ref_curve:
        raise ValueError(f"reference depth {ref}: no row records {ppl_key!r}")
    ref_step, ref_ppl = ref_curve[-1]
    steps: dict[int, Optional[int]] = {}
    for depth in sorted(runs):
        if depth == ref:
            steps[depth] = ref_step
            continue
        run = runs[depth]
        steps[depth] = matched_checkpoint(ref_ppl, curve(run["metrics_rows"], ppl_key),
                                          run["saved_steps"])
    return {"reference_depth": ref, "reference_ppl": ref_ppl, "steps": steps}


def common_threshold(curves: Mapping[str, Sequence[tuple[int, float]]]) -> float:
    """The lowest loss every run reaches: max over runs of each curve's minimum."""
    mins = [min(v for _, v in c) for c in curves.values() if c]
    if not mins or len(mins) != len(curves):
        raise ValueError("every run needs at least one point")
    return max(mins)


def first_at_or_below(curve_points: Sequence[tuple[int, float]], threshold: float) -> Optional[int]:
    """First step (in step order) whose value is <= threshold; None if none."""
    for step, value in sorted(curve_points):
        if value <= threshold:
            return step
    return None


def equal_loss_points(eval_rows_by_run: Mapping[str, Sequence[Mapping]],
                      threshold: Optional[float] = None,
                      loss_key: str = "dev_loss") -> dict[str, dict]:
    """Per run, the first evaluation at or below a shared loss: {"threshold", "step", "row"}.

    threshold None -> common_threshold of the runs' curves, which every run reaches. row is
    the (deduplicated) eval row at that step, so callers read its accuracies; step and row
    are None for a run that never reaches an explicit threshold.
    """
    by_step = {name: _by_step(rows, loss_key) for name, rows in eval_rows_by_run.items()}
    curves = {name: curve(rows, loss_key) for name, rows in eval_rows_by_run.items()}
    if threshold is None:
        threshold = common_threshold(curves)
    out = {}
    for name, c in curves.items():
        step = first_at_or_below(c, threshold)
        out[name] = {"threshold": threshold, "step": step,
                     "row": None if step is None else dict(by_step[name][step])}
    return out
