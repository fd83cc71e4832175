"""Turn the depth sweep's results into Table 3 and Figures 2-7 (Petty et al.).

A sweep writes one JSON object per finished unit, ``results/<unit>.json`` (a sweep of an
earlier version appended them, one per line, to ``results.jsonl``; both are read):

  * ``kind="pretrain"``: one per (size_class, depth, seed): ``d_model``, ``d_ff``, ``params``,
    ``valid_ppl``, ``valid_loss``, ``step``, and ``grammatical`` on the embedded grammar.
  * ``kind="finetune"``: one per (size_class, depth, seed, task, init) with ``init`` in
    {"final", "matched", "scratch"} (the last: fresh weights, the control without
    pretraining): ``dev_loss``, ``id_accuracy``, ``gen_accuracy``, ``lexical``, ``structural`` (the
    last two may be None, e.g. GeoQuery).
  * ``kind="equal_loss"``: generalization at the fine-tuning evaluation point where the
    in-distribution loss first reached ``threshold``; ``step`` is None when it never did (those
    rows are skipped in the aggregates and counted in ``not_reached``).

Runs are resumable and append, so the same run can appear twice; `dedupe` keeps the later row.
Extra keys are ignored throughout. Confidence intervals are the 95% Student-t intervals of the
mean over seeds (`exact_match.mean_ci95`); with a single seed the CI is None (blank in tables).

CLI: ``python -m jaxdepth.analysis.report SWEEP_DIR --out DIR`` (or a results.jsonl).
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from jaxdepth.analysis import depth_contrast, plots

from jaxdepth.analysis.results import (_index, _matches, _sort_key, aggregate, architecture,
                                       dedupe, load_rows, relative_perplexity, size_classes, tasks)


def _fmt(mean: Optional[float], ci: Optional[float], scale: float = 1.0, digits: int = 1) -> str:
    if mean is None:
        return ""
    text = f"{mean * scale:.{digits}f}"
    return text if ci is None else f"{text} ± {ci * scale:.{digits}f}"


def _fmt_int(v: Any) -> str:
    if v is None:
        return ""
    return f"{int(v):,}" if isinstance(v, (int, float)) and float(v).is_integer() else str(v)


def _markdown(header: Sequence[str], lines: Sequence[Sequence[str]], caption: str = "") -> str:
    def row(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    align = [":---" if h in ("size class", "task") else "---:" for h in header]
    parts = ([caption, ""] if caption else []) + [row(header), "|" + "|".join(align) + "|"]
    parts += [row(cells) for cells in lines]
    return "\n".join(parts) + "\n"


def _csv(header: Sequence[str], lines: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if c is None else c for c in cells] for cells in lines])
    return buf.getvalue()


def _stat_header(name: str) -> list[str]:
    return [f"{name}_mean", f"{name}_ci95", f"{name}_n"]


def _stat_cells(a: Optional[dict]) -> list:
    return [None, None, 0] if a is None else [a["mean"], a["ci95"], a["n"]]


# --------------------------------------------------------------------------------------------
# Tables


def table3(rows: Iterable[Mapping[str, Any]], init: str = "final") -> tuple[str, str]:
    """Markdown and CSV of Table 3: one line per (size_class, depth).

    Columns: size class, depth, d_model, d_ff, params, d_model/d_ff, validation perplexity
    (mean ± 95% CI over seeds, of the final pretraining checkpoint), then for each task (sorted)
    generalization accuracy, then for each task in-distribution accuracy, then for each task
    the final in-distribution (dev) loss, all of models
    fine-tuned from `init` ("final" or "matched" checkpoint, or "scratch": fresh weights), in
    percent with one decimal.
    The CSV holds unformatted numbers (accuracies as fractions), with mean, ci95 and n in
    separate columns; a missing CI (single seed) is blank.
    """
    rows = list(rows)
    by = ("size_class", "depth")
    where = {"init": init}
    task_list = tasks(rows, "finetune", where)
    # Fresh weights were never pretrained: their table lists only the depths fine-tuned that
    # way, with the seeds of their fine-tunings and no perplexity or grammaticality.
    pretrained = init != "scratch"
    ppl = _index(aggregate(rows, "pretrain", "valid_ppl", by), by) if pretrained else {}
    # syntactic well-formedness of what each pretrained model writes (embedded grammar only)
    gram = _index(aggregate(rows, "pretrain", "grammatical", by), by) if pretrained else {}
    columns = (("gen_accuracy", 100.0, 1), ("id_accuracy", 100.0, 1), ("dev_loss", 1.0, 3))
    finetuned = {k: {t: _index(aggregate(rows, "finetune", k, by, {**where, "task": t}), by)
                     for t in task_list} for k, _, _ in columns}
    arch = architecture(rows)
    models = sorted({(r.get("size_class"), r.get("depth")) for r in rows
                     if (pretrained and r.get("kind") == "pretrain")
                     or (r.get("kind") == "finetune" and r.get("init") == init)},
                    key=_sort_key)

    md_header = ["size class", "depth", "d_model", "d_ff", "params", "d_model/d_ff",
                 "seeds", "valid ppl"] + (["grammatical (%)"] if gram else [])
    md_header += [f"{t} {what}" for what in ("gen acc (%)", "ID acc (%)", "ID loss")
                  for t in task_list]
    csv_header = ["size_class", "depth", "d_model", "d_ff", "params", "ratio",
                  *_stat_header("valid_ppl"), *(_stat_header("grammatical") if gram else [])]
    csv_header += [c for part in ("gen", "id", "id_loss") for t in task_list
                   for c in _stat_header(f"{t}_{part}")]

    md_lines, csv_lines = [], []
    for key in models:
        info = arch.get(key, {})
        p = ppl.get(key)
        ratio = info.get("ratio")
        counts = [finetuned[k][t][key]["n"] for k in ("id_accuracy", "gen_accuracy")
                  for t in task_list if key in finetuned[k][t]]
        seeds = max(([p["n"]] if p else []) + counts, default="")

        def cell(a, scale, digits):  # a sweep mid-way: a cell over fewer seeds says how many
            fewer = "" if a["n"] == seeds else f" (n={a['n']})"
            return _fmt(a["mean"], a["ci95"], scale, digits) + fewer

        md = [key[0], key[1], _fmt_int(info.get("d_model")), _fmt_int(info.get("d_ff")),
              _fmt_int(info.get("params")), "" if ratio is None else f"{ratio:.3f}",
              seeds, "" if p is None else cell(p, 1, 2)]
        cs = [key[0], key[1], info.get("d_model"), info.get("d_ff"), info.get("params"), ratio]
        cs += _stat_cells(p)
        if gram:
            g = gram.get(key)
            md.append("" if g is None else cell(g, 100.0, 1))
            cs += _stat_cells(g)
        for k, scale, digits in columns:
            for t in task_list:
                a = finetuned[k][t].get(key)
                md.append("" if a is None else cell(a, scale, digits))
                cs += _stat_cells(a)
        md_lines.append(md)
        csv_lines.append(cs)
    start = {"final": "the final checkpoint", "matched": "the perplexity-matched checkpoint",
             "scratch": "fresh weights, a control without pretraining"}.get(init, init)
    pretraining = ("perplexity of the final pretraining checkpoint; grammatical = share of its "
                   "sampled continuations the embedded grammar's recognizer accepts; "
                   if pretrained else "no perplexity: these models were not pretrained; ")
    caption = (f"Table 3 (fine-tuned from {start}): mean ± 95% CI over seeds; {pretraining}"
               "accuracies in %; ID loss = final in-distribution (dev) loss per target token.")
    return _markdown(md_header, md_lines, caption), _csv(csv_header, csv_lines)


def equal_loss_table(rows: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """Markdown and CSV of generalization at equal in-distribution loss (Fig. 7b's data): one
    line per (size_class, task, threshold, depth) with gen / lexical / structural accuracy over
    the seeds that reached the threshold, and `not_reached` = seeds that never did."""
    rows = [r for r in rows if r.get("kind") == "equal_loss"]
    by = ("size_class", "task", "threshold", "depth")
    reached = [r for r in rows if r.get("step") is not None]
    stats = {k: _index(aggregate(reached, "equal_loss", k, by), by)
             for k in ("gen_accuracy", "lexical", "structural", "step")}
    keys = sorted({tuple(r.get(k) for k in by) for r in rows}, key=_sort_key)
    md_header = ["size class", "task", "loss threshold", "depth", "reached", "not reached",
                 "gen acc (%)", "lexical (%)", "structural (%)", "step"]
    csv_header = ["size_class", "task", "threshold", "depth", "reached", "not_reached",
                  *(c for k in stats for c in _stat_header(k))]
    md_lines, csv_lines = [], []
    for key in keys:
        group = [r for r in rows if tuple(r.get(k) for k in by) == key]
        n_reached = sum(r.get("step") is not None for r in group)
        not_reached = len(group) - n_reached
        md = list(key) + [n_reached, not_reached]
        cs = list(key) + [n_reached, not_reached]
        for k in ("gen_accuracy", "lexical", "structural"):
            a = stats[k].get(key)
            md.append("" if a is None else _fmt(a["mean"], a["ci95"], 100.0, 1))
            cs += _stat_cells(a)
        s = stats["step"].get(key)
        md.append("" if s is None else _fmt(s["mean"], s["ci95"], 1.0, 0))
        cs += _stat_cells(s)
        md_lines.append(md)
        csv_lines.append(cs)
    caption = ("Generalization at equal in-distribution loss: accuracy at the first fine-tuning "
               "evaluation whose in-distribution loss reached the threshold (mean ± 95% CI over "
               "the seeds that reached it).")
    return _markdown(md_header, md_lines, caption), _csv(csv_header, csv_lines)


# --------------------------------------------------------------------------------------------
# Report


def write_report(rows: Iterable[Mapping[str, Any]], out_dir: str | Path) -> dict[str, Path]:
    """Dedupe the sweep's rows and write every table and figure of them into `out_dir`.

    Writes ``table3.md/.csv`` (init="final"), ``table3_matched.md/.csv`` and
    ``table3_scratch.md/.csv`` if matched or from-scratch rows exist,
    ``contrast.md/.json`` (depth_contrast: the declared contrasts of consecutive depths) and
    ``equal_loss.md/.csv`` if such rows exist, ``relative_perplexity.csv``, and per size class
    the PNG figures of `plots` (``fig2_perplexity_vs_depth_<size>.png``, ``fig3_...``,
    ``fig4_...`` and ``fig_every_seed_...``, ``fig5_...`` when lexical/structural data exist,
    ``fig6_...`` when matched rows exist, ``fig7b_...`` when equal_loss rows exist). Returns
    {file name: path}.
    """
    rows = dedupe(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    def save(name: str, text: str) -> None:
        path = out / name
        path.write_text(text, encoding="utf-8")
        written[name] = path

    kinds = {r.get("kind") for r in rows}
    has = lambda kind, **where: any(r.get("kind") == kind and _matches(r, where) for r in rows)

    md, cs = table3(rows, "final")
    save("table3.md", md)
    save("table3.csv", cs)
    for init in ("matched", "scratch"):
        if has("finetune", init=init):
            md, cs = table3(rows, init)
            save(f"table3_{init}.md", md)
            save(f"table3_{init}.csv", cs)
    if has("finetune", init="final"):  # the declared contrasts of depth (depth_contrast.py)
        contrast = depth_contrast.analyse(rows)
        save("contrast.md", depth_contrast.markdown(contrast))
        save("contrast.json", json.dumps(contrast, indent=1) + "\n")
    if "equal_loss" in kinds:
        md, cs = equal_loss_table(rows)
        save("equal_loss.md", md)
        save("equal_loss.csv", cs)
    rel = relative_perplexity(rows)
    if rel:
        cols = ["size_class", "depth", "d_model", "d_ff", "ratio", "mean_ppl",
                "reference_depth", "reference_ppl", "relative_ppl"]
        save("relative_perplexity.csv", _csv(cols, [[r[c] for c in cols] for r in rel]))

    for sc in size_classes(rows):
        sc_rows = [r for r in rows if r.get("size_class") == sc]
        figures = []
        if has("pretrain", size_class=sc):
            figures += [("fig2_perplexity_vs_depth", plots.perplexity_vs_depth),
                        ("fig3_relative_perplexity", plots.relative_perplexity)]
        if has("finetune", size_class=sc, init="final"):
            figures += [("fig4_generalization_vs_depth", plots.generalization_vs_depth),
                        ("fig_every_seed", plots.every_seed)]
            if any(r.get("kind") == "finetune" and r.get("init") == "final"
                   and (r.get("lexical") is not None or r.get("structural") is not None)
                   for r in sc_rows):
                figures.append(("fig5_lexical_vs_structural", plots.lexical_vs_structural))
        if has("finetune", size_class=sc, init="matched"):
            figures.append(("fig6_matched_generalization", plots.matched_generalization))
        if has("equal_loss", size_class=sc):
            figures.append(("fig7b_equal_loss_generalization", plots.equal_loss_generalization))
        for stem, fn in figures:
            name = f"{stem}_{sc}.png"
            path, _ = fn(sc_rows, out / name, size_class=sc)
            written[name] = Path(path)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxdepth.analysis.report",
        description="Tables (Markdown, CSV) and figures (PNG) of a depth sweep's results.")
    parser.add_argument("results", help="the sweep's directory (or a results.jsonl)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error as well as its one line")
    args = parser.parse_args(argv)

    def body() -> int:
        written = write_report(load_rows(args.results), args.out)
        for name in sorted(written):
            print(written[name])
        return 0

    from ..errors import run_main
    return run_main(body, debug=args.debug)  # a user's error: one line, exit 2


if __name__ == "__main__":
    raise SystemExit(main())
