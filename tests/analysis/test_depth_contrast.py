"""The declared contrast of two depths (analysis/depth_contrast.py) through the sweep's report,
on a synthetic sweep directory whose expected values were computed by hand: dyadic scores
(exact in floating point), Student's t from its closed form for even degrees of freedom
(F(t) = 1/2 + x/2 * sum_k C(2k, k) 4^-k (1 - x^2)^k, x = t / sqrt(nu + t^2)) and the table's
quantiles, Mann-Whitney's normal approximation with its tie correction and continuity
correction, Wilson's formula, and Fisher's exact test by counting hypergeometric tables.

The directory holds what a long sweep meets: an earlier version's results.jsonl with a stale
row that a later result replaces and a torn last line, and a missing unit."""
from __future__ import annotations

import json

import pytest

from jaxdepth.analysis.depth_contrast import antimode, holm, per_depth
from jaxdepth.experiments.depth_sweep import Plan, Sweep, main

SEEDS = range(5)
T975_8, T95_8, T975_4 = 2.306004, 1.859548, 2.776445  # Student's t quantiles, from the table
# passivization, lexical: the deep scores are the shallow ones + 0.25, paired in another order
LEX = {("passivization", 2): [0.125, 0.25, 0.375, 0.5, 0.625],
       ("passivization", 4): [0.5, 0.375, 0.75, 0.625, 0.875],
       # semantic parsing, lexical: two clusters, symmetric about 0.5 when pooled
       ("semantic_parsing", 2): [0.125, 0.125, 0.125, 0.125, 0.875],
       ("semantic_parsing", 4): [0.125, 0.875, 0.875, 0.875, 0.875]}
ID = {("passivization", 2): [0.5, 0.625, 0.75, 0.875, 1.0],
      ("passivization", 4): [0.625, 0.75, 0.875, 1.0, 0.5],  # the same scores: diff 0
      ("semantic_parsing", 2): [1.0] * 5, ("semantic_parsing", 4): [1.0] * 5}
STRUCT = {("passivization", 2): [0.0] * 5, ("passivization", 4): [0.0] * 5,
          ("semantic_parsing", 2): [0.0, 0.0, 0.0, 0.0, 0.125],
          ("semantic_parsing", 4): [0.125, 0.0, 0.0, 0.0, 0.0]}


def _finetune(task, depth, seed, **over):
    key = (task, depth)
    return {"kind": "finetune", "size_class": "tiny", "task": task, "depth": depth, "seed": seed,
            "init": "final", "init_step": 400, "dev_loss": 0.1,
            "id_accuracy": ID[key][seed], "gen_accuracy": LEX[key][seed],
            "lexical": LEX[key][seed], "structural": STRUCT[key][seed], **over}


@pytest.fixture
def sweep_dir(tmp_path):
    plan = Plan(size="tiny", depths=(2, 4), seeds=tuple(SEEDS),
                tasks=("passivization", "semantic_parsing"))
    out = tmp_path / "sweep"
    sweep = Sweep.open(out, plan)
    for depth in (2, 4):
        for seed in SEEDS:
            if (depth, seed) != (4, 4):  # pretrain-L4-s4: the missing unit
                sweep.append({"kind": "pretrain", "depth": depth, "seed": seed, "d_model": 64,
                              "d_ff": 256, "params": 1000, "valid_ppl": 8.5, "valid_loss": 2.1,
                              "step": 400})
            for task in plan.tasks:
                if (task, depth, seed) != ("passivization", 2, 0):
                    sweep.append(_finetune(task, depth, seed))
    # an earlier version's file: a stale row of a unit written again later, and a torn record
    stale = _finetune("passivization", 2, 0, lexical=0.99)
    (out / "results.jsonl").write_text(json.dumps(stale) + "\n" + json.dumps(stale)[:40])
    (out / "results" / "finetune-passivization-L2-s0.json").write_text(
        json.dumps(_finetune("passivization", 2, 0)))
    return out


def test_the_report_s_contrast_is_the_hand_computed_one(sweep_dir, capsys):
    assert main(["report", "--out", str(sweep_dir)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: {sweep_dir / 'results.jsonl'}:2: not a whole result record (a write cut "
        f"short?); left out",
        f"warning: 1 of 30 units have no result: pretrain-L4-s4; `python -m "
        f"jaxdepth.experiments.depth_sweep run --out {sweep_dir}` finishes them"]
    result = json.loads((sweep_dir / "report" / "contrast.json").read_text())
    c = {(x["task"], x["split"]): x for x in result["contrasts"]}
    assert sorted(c) == [(t, s) for t in ("passivization", "semantic_parsing")
                         for s in ("id_accuracy", "lexical", "structural")]

    # passivization, lexical: diff 0.25, s^2 = 0.0390625 at each depth, se 0.125, t 2, df 8
    lex = c["passivization", "lexical"]
    assert lex["role"] == "primary" and (lex["n_deep"], lex["n_shallow"]) == (5, 5)
    assert lex["diff"] == 0.25 and lex["mean_deep"] == 0.625 and lex["mean_shallow"] == 0.375
    assert lex["welch"]["t"] == pytest.approx(2.0) and lex["welch"]["df"] == pytest.approx(8)
    assert lex["welch"]["p"] == pytest.approx(2 * 0.040258118978631, rel=1e-9)
    assert lex["welch"]["ci95"] == pytest.approx([0.25 - T975_8 * 0.125, 0.25 + T975_8 * 0.125],
                                                 abs=1e-6)
    assert lex["welch"]["ci90"] == pytest.approx([0.25 - T95_8 * 0.125, 0.25 + T95_8 * 0.125],
                                                 abs=1e-6)
    # paired by seed: differences 0.375, 0.125, 0.375, 0.125, 0.25: sd 0.125, t 4.472, df 4
    half = T975_4 * 0.125 / 5 ** 0.5
    assert lex["paired"]["n"] == 5 and lex["paired"]["diff"] == 0.25
    assert lex["paired"]["ci95"] == pytest.approx([0.25 - half, 0.25 + half], abs=1e-6)
    assert lex["paired"]["p"] == pytest.approx(0.011056493393450, rel=1e-9)
    # U = 20.5 of 25 (ties: 0.375, 0.5, 0.625), var 25/12 * (11 - 18/90) = 22.5, z = 7.5/4.743
    assert lex["mann_whitney"]["U"] == 20.5
    assert lex["mann_whitney"]["p"] == pytest.approx(0.113846298006658, rel=1e-9)
    # TOST at +-0.10: t = (0.25 - 0.10) / 0.125 = 1.2 against "diff >= 0.10"
    assert lex["tost_p"] == pytest.approx(1 - 0.132233552600908, rel=1e-9)
    # n = 7: t(12) * s * sqrt(2/7) = 2.1788 * 0.19764 * 0.53452 = 0.2302 < 0.25; n = 6: 0.2543
    assert lex["seeds_to_decide"] == 7
    assert lex["reading"] == ("inconclusive: 90% interval [1.8, 48.2]; about 7 seeds per depth "
                              "would decide")

    # semantic parsing, lexical: diff 0.45, s^2 = 0.1125 each, se sqrt(0.045), df 8
    sp = c["semantic_parsing", "lexical"]
    assert sp["diff"] == pytest.approx(0.45)
    assert sp["welch"]["p"] == pytest.approx(2 * 0.033344, rel=1e-6)
    assert sp["tost_p"] == pytest.approx(1 - 0.068784266319377, rel=1e-9)
    assert sp["seeds_to_decide"] == 6
    assert sp["reading"] == ("inconclusive: 90% interval [5.6, 84.4]; about 6 seeds per depth "
                             "would decide")

    # secondary: ID of passivization and structural of semantic parsing have diff 0 (p 1);
    # the two without any spread get no test and no Holm p
    for key in (("passivization", "id_accuracy"), ("semantic_parsing", "structural")):
        assert c[key]["role"] == "secondary" and c[key]["diff"] == 0
        assert c[key]["welch"]["p"] == pytest.approx(1.0) and c[key]["holm_p"] == pytest.approx(1.0)
    assert c["passivization", "id_accuracy"]["tost_p"] == pytest.approx(0.223406667057454,
                                                                         rel=1e-9)
    for key in (("passivization", "structural"), ("semantic_parsing", "id_accuracy")):
        assert c[key]["welch"]["p"] is None and "holm_p" not in c[key]

    # the plateau: pooled {0.125 x 5, 0.875 x 5}, symmetric: antimode 0.5; 4/5 above at 4
    # layers, 1/5 at 2; Fisher: (1 + 25 + 25 + 1) / C(10, 5) = 52/252
    plateau = {p["task"]: p for p in result["plateau"]}
    sp = plateau["semantic_parsing"]
    assert sp["threshold"] == pytest.approx(0.5, abs=1e-3)
    assert sp["depths"]["4"]["above"] == 4 and sp["depths"]["2"]["above"] == 1
    assert sp["depths"]["2"]["wilson95"] == pytest.approx([0.036224108632430, 0.624465370237475],
                                                          rel=1e-9)
    assert sp["depths"]["4"]["wilson95"] == pytest.approx([0.375534629762525, 0.963775891367570],
                                                          rel=1e-9)
    assert sp["fisher_p"] == pytest.approx(52 / 252, rel=1e-12)
    md = (sweep_dir / "report" / "contrast.md").read_text()
    assert ("| tiny | semantic_parsing | 4 - 2 | 50.0 | 4/5 = 80.0% [37.6, 96.4] | "
            "1/5 = 20.0% [3.6, 62.4] | 0.206 |") in md
    assert (sweep_dir / "report" / "fig_every_seed_tiny.png").is_file()


def test_a_median_s_order_statistic_interval():
    # n = 10: P(B <= 1) = 11/1024, so [x_(2), x_(9)] covers the median with 97.9% >= 95%,
    # and [x_(3), x_(8)] only 89%
    d = per_depth([k / 16 for k in range(10)])
    assert d["median"] == 4.5 / 16 and d["median_ci95"] == [1 / 16, 8 / 16]
    assert per_depth([0.5, 0.25, 0.75])["median_ci95"] is None  # too few for 95%


def test_holm_steps_down_and_keeps_the_order_given():
    # sorted 0.01, 0.03, 0.04: x3, x2, x1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_no_antimode_for_one_cluster():
    assert antimode([0.4, 0.5, 0.5, 0.6, 0.55]) is None
    assert antimode([0.25, 0.25, 0.25]) is None  # a single value: no density
