"""Effective rank of the feed-forward matrices (Petty et al., Figs. 10-11).

Petty et al. ask whether deeper-narrower models use their feed-forward capacity: for
``wi_0``, ``wi_1`` and ``wo`` of every layer they plot the cumulative singular values
normalised by their l1 norm, and the effective rank (Roy & Vetterli, 2007)

    erank(T) = exp(-sum_i p_i log p_i),   p_i = sigma_i / ||sigma||_1,   0 log 0 = 0.

erank is 1 for a rank-1 matrix and min(rows, cols) for a matrix with equal singular values,
so ``erank / min(rows, cols)`` compares matrices of different widths (the depth family
changes d_ff with depth).

The model's gated MLP (``layers.GatedMLP``) already uses the t5x names: ``wi_0`` [D, F] is
the gate that goes through GELU, ``wi_1`` [D, F] the linear branch, ``wo`` [F, D] the output.
In a ``DecoderLM`` they live at ``model.blocks.mlp.<name>`` with a leading layer axis L.

For a run's checkpoint: ``python -m jaxdepth.experiments.run_rank --run runs/x``.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

FF_MATRICES = ("wi_0", "wi_1", "wo")
CSV_FIELDS = ("layer", "matrix", "rows", "cols", "erank", "max_rank", "erank_ratio")


# ----------------------------------------------------------------------------- spectra

def normalized_spectrum(matrix) -> np.ndarray:
    """p_i = sigma_i / ||sigma||_1, descending; float64 so tiny sigmas do not vanish.

    An all-zero matrix has no spectrum to normalise and returns zeros.
    """
    m_RC = np.asarray(matrix, dtype=np.float64)
    if m_RC.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {m_RC.shape}")
    sigma_K = np.linalg.svd(m_RC, compute_uv=False)  # already descending
    total = sigma_K.sum()
    return sigma_K / total if total > 0 else np.zeros_like(sigma_K)


def cumulative_spectrum(matrix) -> np.ndarray:
    """Cumulative normalised singular values; ends at 1 (the curves of Fig. 10)."""
    return np.cumsum(normalized_spectrum(matrix))


def effective_rank(matrix) -> float:
    """Roy & Vetterli's effective rank: exp of the spectrum's Shannon entropy, with 0 log 0 = 0;
    0.0 for an all-zero matrix."""
    p_K = normalized_spectrum(matrix)
    nz = p_K[p_K > 0]
    return float(np.exp(-np.sum(nz * np.log(nz)))) if p_K.any() else 0.0


# ----------------------------------------------------------------------------- model tables

def ff_rank_table(model) -> list[dict]:
    """One row per (layer, matrix) of a DecoderLM: shape, erank, max_rank, erank_ratio,
    cumulative curve."""
    weights = {name: np.asarray(getattr(model.blocks.mlp, name)) for name in FF_MATRICES}
    n_layers = next(iter(weights.values())).shape[0]
    rows = []
    for layer in range(n_layers):
        for name in FF_MATRICES:
            w_RC = weights[name][layer]
            er = effective_rank(w_RC)
            max_rank = min(w_RC.shape)
            rows.append({"layer": layer, "matrix": name, "shape": list(w_RC.shape),
                         "erank": er, "max_rank": max_rank, "erank_ratio": er / max_rank,
                         "cumulative": cumulative_spectrum(w_RC).tolist()})
    return rows


# ----------------------------------------------------------------------------- outputs

def write_rank_outputs(rows: Sequence[Mapping], out_dir, label: str = "") -> dict[str, Path]:
    """ff_rank.csv (no curves), ff_rank.json (everything) and ff_rank.png; returns the paths."""
    from .plots import plt, save_png

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "ff_rank.csv", "json": out_dir / "ff_rank.json",
             "png": out_dir / "ff_rank.png"}
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "rows": r["shape"][0], "cols": r["shape"][1]} for r in rows)
    paths["json"].write_text(json.dumps({"label": label, "rows": list(rows)}, indent=1) + "\n")

    layers = sorted({r["layer"] for r in rows})
    fig, axes = plt.subplots(1, len(FF_MATRICES) + 1, figsize=(4 * (len(FF_MATRICES) + 1), 3.6))
    cmap = plt.get_cmap("viridis")
    for ax, name in zip(axes, FF_MATRICES):
        for r in (r for r in rows if r["matrix"] == name):
            curve_K = np.asarray(r["cumulative"])
            x_K = np.arange(1, len(curve_K) + 1) / r["max_rank"]
            color = cmap(r["layer"] / max(1, len(layers) - 1))
            ax.plot(x_K, curve_K, color=color, lw=1, label=f"layer {r['layer']}")
        ax.set_title(name)
        ax.set_xlabel("index / max rank")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("cumulative normalised singular value")
    if len(layers) <= 12:
        axes[0].legend(fontsize=7)
    ax = axes[-1]
    for name in FF_MATRICES:
        by_layer = sorted((r["layer"], r["erank_ratio"]) for r in rows if r["matrix"] == name)
        ax.plot([l for l, _ in by_layer], [v for _, v in by_layer], marker="o", label=name)
    ax.set_title("erank / max rank")
    ax.set_xlabel("layer")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    if label:
        fig.suptitle(label)
    save_png(fig, paths["png"])
    return paths


def rank_vs_depth(rows: Sequence[Mapping]) -> list[dict]:
    """Mean erank_ratio (and erank) over layers, per (depth, matrix): the points of Fig. 11."""
    out = []
    for depth in sorted({r["depth"] for r in rows}):
        for name in FF_MATRICES:
            sel = [r for r in rows if r["depth"] == depth and r["matrix"] == name]
            if sel:
                out.append({"depth": depth, "matrix": name, "n": len(sel),
                            "mean_erank": float(np.mean([r["erank"] for r in sel])),
                            "mean_erank_ratio": float(np.mean([r["erank_ratio"] for r in sel]))})
    return out


def write_rank_vs_depth(rows: Sequence[Mapping], out_dir) -> dict[str, Path]:
    """ff_rank_by_depth.csv and .png from rows carrying a ``depth`` field; returns the paths."""
    from .plots import plt, save_png

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = rank_vs_depth(rows)
    paths = {"csv": out_dir / "ff_rank_by_depth.csv", "png": out_dir / "ff_rank_by_depth.png"}
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=("depth", "matrix", "n", "mean_erank",
                                               "mean_erank_ratio"))
        writer.writeheader()
        writer.writerows(points)
    fig, ax = plt.subplots(figsize=(4.5, 3.6))
    for name in FF_MATRICES:
        pts = [p for p in points if p["matrix"] == name]
        ax.plot([p["depth"] for p in pts], [p["mean_erank_ratio"] for p in pts], marker="o",
                label=name)
    ax.set_xlabel("layers")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("mean erank / max rank")
    ax.legend()
    save_png(fig, paths["png"])
    return paths
