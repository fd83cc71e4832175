"""Tables and figures of a depth sweep from synthetic result rows (jaxdepth.analysis.report)."""
import csv
import io
import json
import math

import pytest

from jaxdepth.analysis import plots
from jaxdepth.analysis.report import (aggregate, dedupe, equal_loss_table, load_rows,
                                      relative_perplexity, table3, write_report)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T1 = math.tan(0.475 * math.pi)  # t_{0.975}(1): a Cauchy quantile

DEPTHS = (2, 4, 6)
ARCH = {2: (128, 512, 400_000), 4: (96, 256, 410_000), 6: (80, 160, 405_000)}
PPL = {2: (10.0, 12.0), 4: (8.0, 8.5), 6: (7.0, 7.4)}
GEN = {"cogs": {2: (0.30, 0.34), 4: (0.40, 0.44), 6: (0.50, 0.52)},
       "geoquery": {2: (0.20, 0.20), 4: (0.25, 0.35), 6: (0.30, 0.40)}}
ID_ACC = {"cogs": 0.95, "geoquery": 0.80}
LEX = {2: (0.40, 0.44), 4: (0.50, 0.50), 6: (0.60, 0.64)}
STRUCT = {2: (0.02, 0.04), 4: (0.05, 0.07), 6: (0.10, 0.12)}
MATCHED = {2: (0.28, 0.30), 4: (0.36, 0.40), 6: (0.45, 0.47)}


def make_rows(seeds=(0, 1)):
    rows = []
    for d in DEPTHS:
        d_model, d_ff, params = ARCH[d]
        for s in seeds:
            rows.append({"kind": "pretrain", "size_class": "tiny", "depth": d, "seed": s,
                         "d_model": d_model, "d_ff": d_ff, "params": params,
                         "valid_ppl": PPL[d][s], "valid_loss": math.log(PPL[d][s]),
                         "step": 600, "extra": "ignored"})
    # An interrupted run logged first; its rerun (appended later, below) must win.
    rows.append({"kind": "finetune", "size_class": "tiny", "depth": 2, "seed": 0,
                 "task": "cogs", "init": "final", "init_step": 600, "dev_loss": 9.0,
                 "id_accuracy": 0.10, "gen_accuracy": 0.99, "lexical": 0.99,
                 "structural": 0.99, "by_type": {}})
    for task in sorted(GEN):
        for d in DEPTHS:
            for s in seeds:
                cogs = task == "cogs"
                rows.append({"kind": "finetune", "size_class": "tiny", "depth": d, "seed": s,
                             "task": task, "init": "final", "init_step": 600, "dev_loss": 0.1,
                             "id_accuracy": ID_ACC[task] + 0.01 * s,
                             "gen_accuracy": GEN[task][d][s],
                             "lexical": LEX[d][s] if cogs else None,
                             "structural": STRUCT[d][s] if cogs else None,
                             "by_type": {"pp_recursion": 0.0}})
    for d in DEPTHS:
        for s in seeds:
            rows.append({"kind": "finetune", "size_class": "tiny", "depth": d, "seed": s,
                         "task": "cogs", "init": "matched", "init_step": 100 * d,
                         "dev_loss": 0.2, "id_accuracy": 0.9, "gen_accuracy": MATCHED[d][s],
                         "lexical": None, "structural": None})
            rows.append({"kind": "equal_loss", "size_class": "tiny", "depth": d, "seed": s,
                         "task": "cogs", "threshold": 0.2,
                         "step": None if (d, s) == (2, 1) else 500 + 50 * d,
                         "gen_accuracy": GEN["cogs"][d][s] - 0.05,
                         "lexical": LEX[d][s], "structural": STRUCT[d][s]})
    return rows


def write_jsonl(path, rows, torn_tail=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if torn_tail:
        text += '{"kind": "pretrain", "size_cl'
    path.write_text(text)
    return path


def by_depth(aggs):
    return {a["depth"]: a for a in aggs}


# ------------------------------------------------------------------------------------------


def test_load_rows_leaves_out_a_torn_record_with_one_line_and_names_missing_file(
        tmp_path, capsys):
    rows = make_rows()
    path = write_jsonl(tmp_path / "results.jsonl", rows, torn_tail=True)
    assert load_rows(path) == rows
    assert capsys.readouterr().err == (f"warning: {path}:{len(rows) + 1}: not a whole result "
                                       f"record (a write cut short?); left out\n")
    # a fragment that swallowed the next record (jaxdepth up to f102334 appended after it)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "pre{"kind": "pretrain", "by": {"a": 1}}\n{"kind": "x"}\n')
    assert load_rows(bad) == [{"kind": "pretrain", "by": {"a": 1}}, {"kind": "x"}]
    assert capsys.readouterr().err.startswith(f"warning: {bad}:1: not a whole result record")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(tmp_path / "nope.jsonl")


def test_dedupe_keeps_later_row():
    rows = make_rows()
    deduped = dedupe(rows)
    assert len(deduped) == len(rows) - 1
    cogs2 = [r for r in deduped if r["kind"] == "finetune" and r["task"] == "cogs"
             and r["init"] == "final" and r["depth"] == 2 and r["seed"] == 0]
    assert len(cogs2) == 1 and cogs2[0]["gen_accuracy"] == 0.30
    # Matched and final rows of the same run are distinct.
    assert sum(r["kind"] == "finetune" and r["init"] == "matched" for r in deduped) == 6


def test_aggregate_means_and_ci_by_hand():
    rows = dedupe(make_rows())
    ppl = by_depth(aggregate(rows, "pretrain", "valid_ppl"))
    assert list(ppl) == [2, 4, 6]
    # depth 2: values 10, 12 -> mean 11, s = sqrt(2), half-width = t * s / sqrt(2) = t.
    assert ppl[2]["n"] == 2 and ppl[2]["values"] == [10.0, 12.0]
    assert ppl[2]["mean"] == pytest.approx(11.0)
    assert ppl[2]["ci95"] == pytest.approx(T1 * math.sqrt(2) / math.sqrt(2))
    # depth 4: 8, 8.5 -> s / sqrt(2) = 0.25.
    assert ppl[4]["mean"] == pytest.approx(8.25)
    assert ppl[4]["ci95"] == pytest.approx(T1 * 0.25)
    gen = by_depth(aggregate(rows, "finetune", "gen_accuracy",
                             where={"task": "cogs", "init": "final"}))
    assert gen[2]["mean"] == pytest.approx(0.32)  # the duplicate 0.99 was overridden
    assert gen[2]["ci95"] == pytest.approx(T1 * 0.02)
    assert gen[6]["ci95"] == pytest.approx(T1 * 0.01)
    # None values are excluded: geoquery has no lexical split.
    assert aggregate(rows, "finetune", "lexical", where={"task": "geoquery"}) == []
    # Grouping by several keys, sorted by keys.
    multi = aggregate(rows, "finetune", "gen_accuracy", by=("task", "depth"),
                      where={"init": "final"})
    assert [(a["task"], a["depth"]) for a in multi] == [
        ("cogs", 2), ("cogs", 4), ("cogs", 6), ("geoquery", 2), ("geoquery", 4), ("geoquery", 6)]
    # A single value: mean is the value, no CI.
    one = aggregate(rows, "pretrain", "valid_ppl", where={"seed": 1, "depth": 4})
    assert one == [{"depth": 4, "n": 1, "mean": 8.5, "ci95": None, "values": [8.5]}]


def test_table3_markdown_and_csv():
    rows = dedupe(make_rows())
    md, text = table3(rows)
    assert "11.00 ± 12.71" in md  # perplexity at depth 2
    assert "32.0 ± 25.4" in md  # cogs gen accuracy at depth 2: 100 * t * 0.02 = 25.4
    assert "20.0 ± 0.0" in md  # geoquery at depth 2: both seeds 0.20
    assert "95.5 ± 6.4" in md  # cogs ID accuracy: 0.95, 0.96
    assert "0.250" in md and "0.375" in md and "0.500" in md  # d_model / d_ff
    assert md.index("cogs gen acc") < md.index("geoquery gen acc") < md.index("cogs ID acc")
    table = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["depth"]) for r in table] == [2, 4, 6]
    d2 = table[0]
    assert float(d2["valid_ppl_mean"]) == pytest.approx(11.0)
    assert float(d2["valid_ppl_ci95"]) == pytest.approx(T1)
    assert float(d2["cogs_gen_mean"]) == pytest.approx(0.32)
    assert float(table[1]["geoquery_gen_mean"]) == pytest.approx(0.30)
    assert float(table[2]["cogs_id_mean"]) == pytest.approx(0.955)
    assert float(d2["cogs_id_loss_mean"]) == pytest.approx(0.1)  # the rerun's 0.1, not 9.0
    assert "cogs ID loss" in md and "0.100 ± 0.000" in md
    assert int(d2["d_ff"]) == 512 and int(d2["params"]) == 400_000
    assert float(d2["ratio"]) == pytest.approx(0.25)
    # Matched table: only cogs.
    md_m, text_m = table3(rows, init="matched")
    assert "geoquery" not in md_m
    assert float(list(csv.DictReader(io.StringIO(text_m)))[1]["cogs_gen_mean"]) == \
        pytest.approx(0.38)


def test_relative_perplexity_by_hand():
    rel = relative_perplexity(dedupe(make_rows()))
    assert [r["depth"] for r in rel] == [2, 4, 6]
    assert all(r["reference_depth"] == 2 for r in rel)
    assert [r["relative_ppl"] for r in rel] == pytest.approx([1.0, 8.25 / 11.0, 7.2 / 11.0])
    assert [r["ratio"] for r in rel] == pytest.approx([128 / 512, 96 / 256, 80 / 160])


def test_equal_loss_table_counts_not_reached():
    md, text = equal_loss_table(dedupe(make_rows()))
    table = {int(r["depth"]): r for r in csv.DictReader(io.StringIO(text))}
    assert table[2]["not_reached"] == "1" and table[2]["reached"] == "1"
    assert float(table[2]["gen_accuracy_mean"]) == pytest.approx(0.25)
    assert table[2]["gen_accuracy_ci95"] == ""
    assert float(table[4]["gen_accuracy_mean"]) == pytest.approx(0.37)
    assert table[4]["not_reached"] == "0"


def _is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


def test_write_report_and_plot_series(tmp_path):
    results = write_jsonl(tmp_path / "results.jsonl", make_rows(), torn_tail=True)
    written = write_report(load_rows(results), tmp_path / "out")
    for name in ("table3.md", "table3.csv", "table3_matched.md", "table3_matched.csv",
                 "equal_loss.md", "equal_loss.csv"):
        assert written[name].is_file() and written[name].stat().st_size > 0
    pngs = {n for n in written if n.endswith(".png")}
    assert pngs == {f"fig{k}_tiny.png" for k in (
        "2_perplexity_vs_depth", "3_relative_perplexity", "4_generalization_vs_depth",
        "_every_seed",
        "5_lexical_vs_structural", "6_matched_generalization",
        "7b_equal_loss_generalization")}
    assert all(_is_png(written[n]) for n in pngs)

    rows = dedupe(make_rows())
    fig = tmp_path / "figs"
    path, s = plots.perplexity_vs_depth(rows, fig / "f2.png")
    assert _is_png(path)
    ppl = aggregate(rows, "pretrain", "valid_ppl")
    assert s["valid_ppl"]["x"] == [2, 4, 6]
    assert s["valid_ppl"]["mean"] == [a["mean"] for a in ppl]
    assert s["valid_ppl"]["ci95"] == [a["ci95"] for a in ppl]

    path, s = plots.relative_perplexity(rows, fig / "f3.png")
    assert _is_png(path)
    assert s["vs_depth"]["y"] == pytest.approx([1.0, 0.75, 7.2 / 11])
    assert s["vs_ratio"]["x"] == pytest.approx([0.25, 0.375, 0.5])

    path, s = plots.generalization_vs_depth(rows, fig / "f4.png")
    assert _is_png(path) and set(s) == {"cogs", "geoquery"}
    for task in ("cogs", "geoquery"):
        agg = aggregate(rows, "finetune", "gen_accuracy", where={"task": task, "init": "final"})
        assert s[task]["mean"] == [a["mean"] for a in agg]
        assert s[task]["ci95"] == [a["ci95"] for a in agg]

    path, s = plots.lexical_vs_structural(rows, fig / "f5.png")
    assert _is_png(path) and set(s) == {"cogs"}  # geoquery has no lexical/structural split
    assert s["cogs"]["structural"]["mean"] == pytest.approx([0.03, 0.06, 0.11])
    assert s["cogs"]["lexical"]["ci95"][1] == pytest.approx(0.0)

    path, s = plots.matched_generalization(rows, fig / "f6.png")
    assert _is_png(path)
    assert s["cogs"]["matched"]["mean"] == pytest.approx([0.29, 0.38, 0.46])
    assert s["cogs"]["final"]["mean"] == pytest.approx([0.32, 0.42, 0.51])

    path, s = plots.equal_loss_generalization(rows, fig / "f7b.png")
    assert _is_png(path)
    assert s["cogs"]["mean"] == pytest.approx([0.25, 0.37, 0.46])
    assert s["cogs"]["n"] == [1, 2, 2]  # the seed that never reached the threshold is skipped


def test_single_seed_sweep(tmp_path):
    results = write_jsonl(tmp_path / "results.jsonl", make_rows(seeds=(0,)))
    written = write_report(load_rows(results), tmp_path / "out")
    md = written["table3.md"].read_text()
    assert "10.00 |" in md and "±" not in md.split("\n", 1)[1]  # caption aside, no CI
    table = list(csv.DictReader(io.StringIO(written["table3.csv"].read_text())))
    assert table[0]["valid_ppl_ci95"] == "" and float(table[0]["valid_ppl_mean"]) == 10.0
    assert table[0]["cogs_gen_n"] == "1"
    assert all(_is_png(p) for n, p in written.items() if n.endswith(".png"))
    assert "fig4_generalization_vs_depth_tiny.png" in written
    _, s = plots.perplexity_vs_depth(load_rows(results), tmp_path / "f2.png")
    assert s["valid_ppl"]["ci95"] == [None, None, None]


def test_cli(tmp_path, capsys):
    from jaxdepth.analysis.report import main
    results = write_jsonl(tmp_path / "results.jsonl", make_rows())
    assert main([str(results), "--out", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "table3.md").is_file()
    assert "table3.csv" in capsys.readouterr().out


def test_table3_grammatical_column_only_when_measured():
    rows = dedupe(make_rows())
    md, _ = table3(rows)
    header = next(line for line in md.splitlines() if line.startswith("|"))
    assert "grammatical" not in header
    for r in rows:
        if r["kind"] == "pretrain":  # depth 4: 0.50 and 0.70 -> 60.0 ± 100 * t * 0.1
            r["grammatical"] = {2: 0.2, 4: 0.5, 6: 0.8}[r["depth"]] + 0.2 * r["seed"]
    md, text = table3(rows)
    assert "grammatical (%)" in md and f"60.0 ± {100 * T1 * 0.1:.1f}" in md
    table = list(csv.DictReader(io.StringIO(text)))
    assert [float(t["grammatical_mean"]) for t in table] == pytest.approx([0.3, 0.6, 0.9])


def test_table3_scratch_lists_only_the_control_depths():
    rows = dedupe(make_rows())
    for s, acc in ((0, 0.70), (1, 0.74)):  # depth 4 only, fine-tuned from fresh weights
        rows.append({"kind": "finetune", "size_class": "tiny", "depth": 4, "seed": s,
                     "task": "cogs", "init": "scratch", "init_step": None, "dev_loss": 0.3,
                     "id_accuracy": 0.9, "gen_accuracy": acc, "lexical": None,
                     "structural": None})
    md, text = table3(rows, init="scratch")
    table = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["depth"]) for r in table] == [4]
    assert table[0]["valid_ppl_mean"] == "" and float(table[0]["cogs_gen_mean"]) == pytest.approx(0.72)
    line = next(ln for ln in md.splitlines() if ln.startswith("| tiny | 4 |"))
    assert "| 2 |  |" in line and f"72.0 ± {100 * T1 * 0.02:.1f}" in line  # 2 seeds, no ppl
    assert "not pretrained" in md

