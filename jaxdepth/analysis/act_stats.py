"""Statistics of the ACT encoder (Simoulin & Crabbé 2021; docs/design.md §3, "Statistics to
report").

* Table 1: MLM and SOP accuracy and the mean number of iterations N (the number of updates a
  token received) for all real tokens, unmasked tokens, the three kinds of MLM-selected tokens
  ([MASK/MASK] replaced by [MASK], [MASK/random] replaced by a random token, [MASK/original]
  kept) and the [CLS] / [SEP] tokens. The ponder N + R is accumulated alongside.
* Table 3: the mean N per token role, when the tokens carry roles.
* Fig. 2: the mean cosine similarity between consecutive iteration states h[n] and h[n+1].

Batches are dicts of NumPy arrays in the pretraining format (``tokens``, ``segments``, ``mask``,
``mlm_positions``, ``mlm_ids``, ``mlm_weights``, ``sop_labels``, ``mask_kind`` and optionally
``roles``, see `token_groups` and `IterationStats.add`). Everything is accumulated on the host
in float64, so statistics pool tokens (not batch means) over any number of batches.

Conventions:
* Padding (``mask == 0``) never counts; an MLM slot counts iff its weight is > 0 (each counts
  once, whatever its weight); an all-padding row (a filler row of a fixed-size batch) does not
  count for SOP.
* A statistic with nothing to average is None in `IterationStats` results (JSON-friendly) and
  NaN in the cosine curves (so plots break the line there).
* Iteration states: ``states_MBTD[m]`` is h[m + 1], the state after iteration m + 1, and h[0]
  is the embedding output. The cosine at step n compares h[n] with h[n + 1]. Only the first
  ``iterations_run`` iterations were actually computed: the later entries of ``states_MBTD``
  are copies of the last state (the while-loop fills them; the scan leaves everything frozen),
  so their cosine would be a meaningless 1.0 and is reported as NaN instead.
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import jax.numpy as jnp
import numpy as np

from jaxdepth.data.corpus.tokenizer import CLS_ID, SEP_ID
from jaxdepth.models.trial_axis import Models

GROUPS = ("all", "unmasked", "[MASK/MASK]", "[MASK/random]", "[MASK/original]", "[CLS]", "[SEP]")
MASK_KINDS = {"[MASK/MASK]": 1, "[MASK/random]": 2, "[MASK/original]": 3}


# --------------------------------------------------------------------------------- token groups

def token_groups(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Boolean masks [B, T] of the Table-1 token groups (keys in the order of `GROUPS`).

    "all": real tokens; "unmasked": real tokens not selected for MLM (``mask_kind == 0``) other
    than [CLS] and [SEP]; "[MASK/MASK]" / "[MASK/random]" / "[MASK/original]": real tokens with
    ``mask_kind`` 1 / 2 / 3; "[CLS]" / "[SEP]": real tokens with those ids.
    """
    tokens = np.asarray(batch["tokens"])
    real = np.asarray(batch["mask"]) != 0
    kind = np.asarray(batch["mask_kind"])
    cls, sep = real & (tokens == CLS_ID), real & (tokens == SEP_ID)
    out = {"all": real, "unmasked": real & (kind == 0) & ~cls & ~sep}
    for name, k in MASK_KINDS.items():
        out[name] = real & (kind == k)
    out["[CLS]"], out["[SEP]"] = cls, sep
    return out


def _ratio(num: float, den: float) -> Optional[float]:
    return float(num / den) if den > 0 else None


# ---------------------------------------------------------------------- iterations and accuracy

class IterationStats:
    """Accumulates Table 1 (mean N per token group, MLM / SOP accuracy) and Table 3 (mean N per
    role) over batches. ``role_names[i]`` names role id i; without it roles are named by id."""

    def __init__(self, role_names: Optional[Sequence[str]] = None):
        self.role_names = None if role_names is None else [str(r) for r in role_names]
        self._n = {g: 0.0 for g in GROUPS}  # sum of N
        self._n2 = {g: 0.0 for g in GROUPS}  # sum of N^2
        self._ponder = {g: 0.0 for g in GROUPS}  # sum of N + R
        self._count = {g: 0 for g in GROUPS}
        self._hist: dict[str, dict[int, int]] = {g: {} for g in GROUPS}  # N -> tokens
        self._mlm = [0, 0]  # correct, total
        self._sop = [0, 0]
        # name -> [sum N, sum N + R, count]
        self._roles: dict[str, list] = {name: [0.0, 0.0, 0] for name in self.role_names or ()}

    def add(self, batch: Mapping[str, Any], N_BT, R_BT, *, mlm_logits=None,
            sop_logits=None) -> None:
        """Add one batch. ``N_BT`` / ``R_BT`` [B, T]: the model's number of updates and
        remainders; ``mlm_logits`` [B, P, V] at ``batch["mlm_positions"]``; ``sop_logits``
        [B, 2]; the batch's ``roles`` [B, T], if any: role ids (-1: none)."""
        N = np.asarray(N_BT, np.float64)
        P = N + np.asarray(R_BT, np.float64)
        for g, sel in token_groups(batch).items():
            self._n[g] += float(N[sel].sum())
            self._n2[g] += float((N[sel] ** 2).sum())
            self._ponder[g] += float(P[sel].sum())
            self._count[g] += int(sel.sum())
            values, counts = np.unique(np.rint(N[sel]).astype(np.int64), return_counts=True)
            for v, c in zip(values.tolist(), counts.tolist()):
                self._hist[g][v] = self._hist[g].get(v, 0) + c
        real = np.asarray(batch["mask"]) != 0
        if mlm_logits is not None:
            pred = np.argmax(np.asarray(mlm_logits), axis=-1)
            used = np.asarray(batch["mlm_weights"]) > 0
            self._mlm[0] += int((used & (pred == np.asarray(batch["mlm_ids"]))).sum())
            self._mlm[1] += int(used.sum())
        if sop_logits is not None:
            pred = np.argmax(np.asarray(sop_logits), axis=-1)
            rows = real.any(axis=-1)
            self._sop[0] += int((rows & (pred == np.asarray(batch["sop_labels"]))).sum())
            self._sop[1] += int(rows.sum())
        if (roles := batch.get("roles")) is not None:
            roles = np.asarray(roles)
            for rid in np.unique(roles[real & (roles >= 0)]):
                sel = real & (roles == rid)
                name = self._role_name(int(rid))
                acc = self._roles.setdefault(name, [0.0, 0.0, 0])
                acc[0] += float(N[sel].sum())
                acc[1] += float(P[sel].sum())
                acc[2] += int(sel.sum())

    def _role_name(self, rid: int) -> str:
        if self.role_names is None:
            return str(rid)
        if rid >= len(self.role_names):
            raise ValueError(f"role id {rid} has no name ({len(self.role_names)} role names)")
        return self.role_names[rid]

    def table1(self) -> dict[str, Any]:
        """The paper's Table 1 row: {"mlm_accuracy", "sop_accuracy" (fractions), "iterations"
        (mean N per group), "iterations_std", "ponder" (mean N + R per group), "tokens" (count
        per group), "histogram" (per group: {"N": tokens that made N updates}, keys as
        strings so the dict survives JSON), "mlm_predictions", "sop_rows"}. Empty groups give
        None (an empty histogram)."""
        it = {g: _ratio(self._n[g], self._count[g]) for g in GROUPS}
        std = {}
        for g in GROUPS:
            c = self._count[g]
            std[g] = (math.sqrt(max(self._n2[g] / c - (self._n[g] / c) ** 2, 0.0)) if c else None)
        return {
            "mlm_accuracy": _ratio(*self._mlm),
            "sop_accuracy": _ratio(*self._sop),
            "iterations": it,
            "iterations_std": std,
            "ponder": {g: _ratio(self._ponder[g], self._count[g]) for g in GROUPS},
            "tokens": dict(self._count),
            "histogram": {g: {str(n): c for n, c in sorted(self._hist[g].items())}
                          for g in GROUPS},
            "mlm_predictions": self._mlm[1],
            "sop_rows": self._sop[1],
        }

    def roles(self) -> dict[str, dict[str, Any]]:
        """Table 3: {role name: {"iterations": mean N, "ponder": mean N + R, "count"}}, in the
        order of ``role_names`` (then first appearance); a role never seen has None means."""
        return {name: {"iterations": _ratio(s, c), "ponder": _ratio(p, c), "count": c}
                for name, (s, p, c) in self._roles.items()}


# ------------------------------------------------------------------------------------- cosines

def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis in float64; exactly 1.0 where a == b (frozen tokens), 0 where
    a vector is zero."""
    dot = np.sum(a * b, axis=-1)
    norm = np.sqrt(np.sum(a * a, axis=-1)) * np.sqrt(np.sum(b * b, axis=-1))
    cos = np.divide(dot, norm, out=np.zeros_like(dot), where=norm > 0)
    return np.where(np.all(a == b, axis=-1), 1.0, cos)


class CosineStats:
    """Accumulates the mean cosine similarity between consecutive states over batches.

    Step n compares h[n] with h[n + 1] (n = 0 compares the embeddings h[0] with h[1], only when
    h0 is given). A step counts for a batch only if iteration n + 1 was run there
    (n + 1 <= iterations_run); a step no batch ran is NaN. Fixed-point view, when N is given:
    tokens with N <= n were not updated at iteration n + 1 ("halted": cosine exactly 1), tokens
    with N > n were ("running").
    """

    def __init__(self, max_iters: int, group_names: Sequence[str] = GROUPS,
                 include_h0: bool = True):
        self.max_iters = int(max_iters)
        self.include_h0 = include_h0
        self.steps = list(range(0 if include_h0 else 1, self.max_iters))
        S = len(self.steps)
        self.group_names = list(group_names)
        self._sum = {k: np.zeros(S) for k in ["overall", *self.group_names, "running", "halted"]}
        self._count = {k: np.zeros(S, np.int64) for k in self._sum}

    def add(self, states_MBTD, h0_BTD, mask, groups: Mapping[str, np.ndarray], iterations_run,
            N_BT=None) -> None:
        states = np.asarray(states_MBTD, np.float64)
        if states.shape[0] != self.max_iters:
            raise ValueError(f"states have {states.shape[0]} iterations, expected {self.max_iters}")
        if self.include_h0:
            if h0_BTD is None:
                raise ValueError("include_h0=True needs h0_BTD")
            states = np.concatenate([np.asarray(h0_BTD, np.float64)[None], states], axis=0)
        else:
            states = np.concatenate([states[:1], states], axis=0)  # index = iteration n
        real = np.asarray(mask) != 0
        N = None if N_BT is None else np.asarray(N_BT, np.float64)
        ran = int(np.asarray(iterations_run))
        for i, n in enumerate(self.steps):
            if n + 1 > ran:
                continue
            cos = _cosine(states[n], states[n + 1])
            sels = {"overall": real, **{g: real & np.asarray(groups[g]) for g in self.group_names}}
            if N is not None:
                sels["running"], sels["halted"] = real & (N > n), real & (N <= n)
            for k, sel in sels.items():
                self._sum[k][i] += float(cos[sel].sum())
                self._count[k][i] += int(sel.sum())

    def result(self) -> dict[str, Any]:
        """{"steps": [n], "overall": [mean cos], "groups": {g: [...]}, "running": [...],
        "halted": [...], "running_fraction": [...], "count": [tokens]}; NaN where nothing
        counted (lists are aligned with "steps")."""
        def mean(k):
            c = self._count[k]
            return [float(s / n) if n > 0 else math.nan for s, n in zip(self._sum[k], c)]

        counts = self._count["overall"]
        frac = [float(r / c) if c > 0 else math.nan
                for r, c in zip(self._count["running"], counts)]
        have_n = bool(self._count["running"].sum() + self._count["halted"].sum())
        return {
            "steps": list(self.steps),
            "overall": mean("overall"),
            "groups": {g: mean(g) for g in self.group_names},
            "running": mean("running") if have_n else None,
            "halted": mean("halted") if have_n else None,
            "running_fraction": frac if have_n else None,
            "count": [int(c) for c in counts],
            "max_iters": self.max_iters,
        }


# ------------------------------------------------------------------------------- whole model

def _forward(model, tokens, segments, mask, positions, use_while: bool):
    """One evaluation step of a device's rows (module level, so it is compiled once per
    model structure, path and batch shape, and reused across `evaluate_act` calls), every
    output with the rows first: the states' iteration axis after them, and on every row the
    iterations its device's loop ran."""
    forward = model.forward_while if use_while else model.forward_scan
    out = forward(tokens, segments, mask, return_states=True)
    h0 = model.embed(tokens, segments)
    ran_B = jnp.broadcast_to(out.iterations_run, tokens.shape[:1])
    return (out.N_BT, out.R_BT, jnp.moveaxis(out.states_MBTD, 0, 1), ran_B, h0,
            model.mlm_logits(out.h_BTD, positions), model.sop_logits(out.h_BTD))


def evaluate_act(model, batches: Iterable[Mapping[str, Any]], *,
                 use_while: bool = True) -> dict[str, Any]:
    """Run ``model`` (ACTEncoder, any halting, or UntiedEncoder) without dropout on every batch
    and return {"table1": IterationStats.table1(), "cosine": CosineStats.result(),
    "roles": IterationStats.roles()}. The forward (while-loop if ``use_while`` else scan, with
    the states, the embeddings h0 and both heads) is jitted once; it retraces only on new shapes.
    For fixed-depth models N = M on every real token."""
    return evaluate_act_each(Models(model), batches, use_while=use_while)[0]


def evaluate_act_each(models, batches: Iterable[Mapping[str, Any]], *,
                      use_while: bool = True) -> list[dict[str, Any]]:
    """``evaluate_act`` of each of `models` (a trial_axis.Models: one model, or a run's
    trials stacked, whose forward runs vmapped over them), one result per model. Each device
    runs its own rows (or trials) and its while-loop stops once its own tokens have halted
    (Models.per_device); under vmap a trial whose tokens halted earlier keeps its state (its
    predicate is false), so its statistics are its own. A batch's iterations run are the
    most any device ran: what one loop over the whole batch would have run."""
    stats = [IterationStats() for _ in range(len(models))]
    cos = [CosineStats(models.model.cfg.max_iters) for _ in range(len(models))]
    for batch in batches:
        arrays = [np.asarray(batch[k], np.int32)
                  for k in ("tokens", "segments", "mask", "mlm_positions")]
        outs = models.per_device(_forward, arrays, bool(use_while))
        for k, (N, R, states_BMTD, ran_B, h0, mlm, sop) in enumerate(outs):
            N, R = np.asarray(N), np.asarray(R)
            stats[k].add(batch, N, R, mlm_logits=mlm, sop_logits=sop)
            cos[k].add(np.moveaxis(np.asarray(states_BMTD), 1, 0), h0, batch["mask"],
                       token_groups(batch), int(np.max(ran_B)), N)
    return [{"table1": st.table1(), "cosine": c.result(), "roles": st.roles()}
            for st, c in zip(stats, cos)]


# ------------------------------------------------------------------------------------ writers

def _fmt(x: Optional[float], spec: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _unpack(stats) -> tuple[dict, dict]:
    if isinstance(stats, IterationStats):
        return stats.table1(), stats.roles()
    if "table1" in stats:
        return stats["table1"], stats.get("roles") or {}
    return stats, {}


def format_table1(stats, label: str = "model") -> str:
    """Markdown Table 1: accuracies in percent with 1 decimal, mean iterations with 2 decimals;
    followed by the per-role table (Table 3) when roles were seen."""
    t1, roles = _unpack(stats)
    head = "| model | MLM acc | SOP acc | " + " | ".join(GROUPS) + " |"
    sep = "|" + "---|" * (3 + len(GROUPS))
    acc = [_fmt(None if t1[k] is None else 100 * t1[k], ".1f")
           for k in ("mlm_accuracy", "sop_accuracy")]
    its = [_fmt(t1["iterations"][g], ".2f") for g in GROUPS]
    lines = ["Mean iterations (number of updates N) per token group; accuracies in %.", "",
             head, sep, "| " + " | ".join([label, *acc, *its]) + " |"]
    hist, total = t1.get("histogram", {}).get("all") or {}, t1["tokens"]["all"]
    if hist and total:  # whether halting differs by token at all
        shares = ", ".join(f"N={n}: {100 * c / total:.1f}%" for n, c in hist.items())
        lines += ["", f"Tokens by number of iterations (all {total}): {shares}."]
    if roles:
        lines += ["", "| role | mean iterations | tokens |", "|---|---|---|"]
        lines += [f"| {name} | {_fmt(r['iterations'], '.2f')} | {r['count']} |"
                  for name, r in roles.items()]
    return "\n".join(lines) + "\n"


def write_table1(stats, path_md: Union[str, Path], path_json: Union[str, Path], *,
                 label: str = "model") -> tuple[Path, Path]:
    """Write Table 1 (and Table 3 if roles were seen) as Markdown and {"table1", "roles"} as
    JSON. ``stats``: an IterationStats, an `evaluate_act` result or a `table1()` dict."""
    t1, roles = _unpack(stats)
    path_md, path_json = Path(path_md), Path(path_json)
    for p in (path_md, path_json):
        p.parent.mkdir(parents=True, exist_ok=True)
    path_md.write_text(format_table1(stats, label))
    path_json.write_text(json.dumps({"table1": t1, "roles": roles}, indent=2) + "\n")
    return path_md, path_json


def _cos_series(cosine: Mapping[str, Any]) -> dict[str, list]:
    series = {g: list(v) for g, v in cosine["groups"].items()}
    if "all" not in series:
        series = {"all": list(cosine["overall"]), **series}
    if cosine.get("running") is not None:
        series["running"] = list(cosine["running"])
    return series


def plot_cosine(cosine: Mapping[str, Any], path_png: Union[str, Path], *,
                title: str = "Cosine similarity of consecutive states") -> Path:
    """Fig. 2: mean cosine(h[n], h[n + 1]) against n, one line per token group (plus the tokens
    still running, dashed). NaN steps (not run) are left blank."""
    from .plots import plt, save_png

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in _cos_series(cosine).items():
        style = "--" if name == "running" else "-"
        ax.plot(cosine["steps"], ys, style, marker="o", markersize=3, label=name)
    ax.set_xlabel("iteration n (cosine of h[n] and h[n+1])")
    ax.set_ylabel("mean cosine similarity")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path_png)


def write_cosine_table(cosine: Mapping[str, Any], path_csv: Union[str, Path]) -> Path:
    """CSV: one row per step n with the token count, the mean cosine per group, of the running
    and halted tokens and the running fraction; steps not run hold "nan"."""
    path_csv = Path(path_csv)
    path_csv.parent.mkdir(parents=True, exist_ok=True)
    cols = _cos_series(cosine)
    for extra in ("halted", "running_fraction"):
        if cosine.get(extra) is not None:
            cols[extra] = list(cosine[extra])
    with path_csv.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n", "tokens", *cols])
        for i, n in enumerate(cosine["steps"]):
            w.writerow([n, cosine["count"][i], *(f"{v[i]:.6f}" for v in cols.values())])
    return path_csv
