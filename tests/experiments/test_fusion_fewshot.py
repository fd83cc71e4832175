"""The few-shot fusion experiment (experiments/fusion_fewshot.py) and its report
(analysis/fusion_report.py), with training replaced by a fake: no model is built or compiled.

The fake `_timed` records the configs it is given and writes what a finished run would leave:
``analysis/ner.json`` for a fine-tuning unit (values chosen here, per unit), ``summary.json``
for the pretraining run. Every expected number is computed by hand in this file.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from jaxdepth.analysis import fusion_report
from jaxdepth.analysis.exact_match import mean_ci95
from jaxdepth.config import ConfigError
from jaxdepth.experiments import fusion_fewshot as ff
from jaxdepth.experiments.fusion_fewshot import PRESETS, Experiment, Plan

T1 = math.tan(0.475 * math.pi)  # t_{0.975} with 1 degree of freedom (n = 2): a Cauchy quantile
BACKBONE = "/nowhere/backbone"
METHODS, MODES, SHOTS, TRIALS = ("base", "dwatt"), ("fe", "ft"), (2, 4), 2
STEPS = (10, 20, 30)


# ------------------------------------------------------------------------------ fixtures

TRAIN = [
    [("Anna", "B-PER"), ("lives", "O"), ("in", "O"), ("Oslo", "B-LOC")],
    [("Bob", "B-PER"), ("Smith", "I-PER")],
    [("IBM", "B-ORG"), ("hires", "O")],
    [("Paris", "B-LOC"), ("is", "O"), ("big", "O")],
    [("Carl", "B-PER")],
    [("the", "O"), ("UN", "B-ORG"), ("met", "O")],
    [("Dora", "B-PER"), ("visits", "O"), ("Rome", "B-LOC")],
    [("Acme", "B-ORG"), ("Corp", "I-ORG")],
    [("Eve", "B-PER"), ("sleeps", "O")],
    [("Berlin", "B-LOC"), ("Zoo", "I-LOC")],
]
DEV = [[("Fred", "B-PER"), ("left", "O")], [("Lima", "B-LOC")]]
TEST = [[("Gus", "B-PER")], [("Nokia", "B-ORG"), ("grew", "O")]]


def _write_wikiann(path: Path, sents) -> None:
    path.write_text("\n\n".join("\n".join(f"en:{t}\t{g}" for t, g in s) for s in sents) + "\n")


@pytest.fixture
def ner_dir(tmp_path) -> str:
    d = tmp_path / "wikiann"
    d.mkdir()
    _write_wikiann(d / "train", TRAIN)
    _write_wikiann(d / "dev", DEV)
    _write_wikiann(d / "test", TEST)
    return str(d)


# ------------------------------------------------------------------------------ the fake


def test_f1(method, mode, n, trial) -> float:
    """The test F1 the fake writes for a unit (irregular digits: no rounding ties)."""
    return (0.30 + 0.10 * METHODS.index(method) + 0.05 * MODES.index(mode) + 0.01 * n
            + 0.0234 * trial + 0.00123)


test_f1.__test__ = False  # not a pytest test


def dev_f1(method, mode, n, trial) -> float:
    return test_f1(method, mode, n, trial) + 0.0311 - 0.0071 * trial


def curve(method, mode, n, trial) -> list[dict]:
    """Dev/test F1 per eval step; trial 1 has one extra step (30 + 10) that trial 0 lacks."""
    steps = STEPS + ((40,) if trial == 1 else ())
    best = dev_f1(method, mode, n, trial)
    return [{"step": s, "dev_f1": best * s / 40 + 0.001 * trial, "test_f1": 0.5 * best * s / 40,
             "loss": 1.0 / s} for s in steps]


@pytest.fixture(autouse=True)
def one_program_per_unit(monkeypatch):
    """The plan/resume/report logic here is checked with a fake trainer standing in for each
    unit's run, so the units run one by one (--sequential); the cells as trials of one
    program are checked with real training in tests/trainer/test_trials.py."""
    monkeypatch.setattr(ff.Experiment, "per_group", 1)


class FakeTrain:
    """Stands in for `_timed`: records cfgs, writes a finished run's files, may fail."""

    def __init__(self, fail_after: int | None = None):
        self.cfgs, self.whats, self.fail_after = [], [], fail_after

    def __call__(self, what, cfg):
        if self.fail_after is not None and len(self.cfgs) >= self.fail_after:
            raise RuntimeError(f"{what} stopped at step 3; run the command again")
        self.cfgs.append(cfg)
        self.whats.append(what)
        run = Path(cfg.run.dir)
        run.mkdir(parents=True, exist_ok=True)
        if cfg.task.name == "ner":
            key = (cfg.fusion.method, cfg.fusion.mode, cfg.task.n_shot, cfg.task.seed)
            rep = {"best_dev_f1": dev_f1(*key), "test_f1_at_best": test_f1(*key),
                   "best_step": 20 + key[3], "train_sentences": 3 * key[2],
                   "curve": curve(*key)}
            (run / "analysis").mkdir(exist_ok=True)
            (run / "analysis" / "ner.json").write_text(json.dumps(rep))
        else:
            (run / "summary.json").write_text(json.dumps({"step": cfg.run.steps, "done": True}))
        return {"done": True, "step": cfg.run.steps}


def _plan(ner_dir, **kw) -> Plan:
    base = dict(ner_dir=ner_dir, backbone=BACKBONE, methods=METHODS, modes=MODES, shots=SHOTS,
                trials=TRIALS, finetune={"run.steps": 5, "optim.lr": 1e-3})
    return Plan(**{**base, **kw})


def _all_units():
    return [(m, mo, n, t) for m in METHODS for mo in MODES for n in SHOTS for t in range(TRIALS)]


def _key(cfg):
    return (cfg.fusion.method, cfg.fusion.mode, cfg.task.n_shot, cfg.task.seed)


def _lines(exp: Experiment) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(exp.results.glob("*.json"))]


@pytest.fixture
def finished(tmp_path, ner_dir, monkeypatch):
    """An experiment of the 16 units of _plan, run with the fake; (exp, fake)."""
    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    exp = Experiment.open(tmp_path / "exp", _plan(ner_dir))
    exp.run()
    return exp, fake


# ------------------------------------------------------------------------------ 1. orchestration


def test_run_trains_every_unit_with_the_planned_config(finished, ner_dir, tmp_path):
    exp, fake = finished
    out = tmp_path / "exp"
    # Every unit once, in plan order (method, mode, N, trial); the backbone is given: no pretraining.
    assert [_key(c) for c in fake.cfgs] == _all_units()
    assert not (out / "pretrain").exists() and not (out / "pretrain_corpus.txt").exists()
    for cfg in fake.cfgs:
        method, mode, n, trial = _key(cfg)
        assert cfg.task.name == "ner"
        assert cfg.task.dir == ner_dir
        assert cfg.task.init_from == BACKBONE
        assert cfg.task.n_shot == n and cfg.task.seed == trial and cfg.run.seed == trial
        assert cfg.fusion.method == method and cfg.fusion.mode == mode
        assert cfg.fusion.extra_layers == 1
        # the plan's fine-tuning overrides, and a checkpoint only at the end
        assert cfg.run.steps == 5 and cfg.run.save_every == 5 and cfg.optim.lr == 1e-3
        assert cfg.run.progress is False
        assert Path(cfg.run.dir) == out / "runs" / f"{method}-{mode}" / f"N{n}-t{trial}"
    assert len({c.run.dir for c in fake.cfgs}) == len(_all_units())
    assert json.loads((out / "plan.json").read_text()) == json.loads(
        json.dumps(_plan(ner_dir).to_json()))


def test_results_hold_what_each_unit_wrote(finished):
    exp, fake = finished
    lines = _lines(exp)
    assert len(lines) == 16
    assert (sorted((r["method"], r["mode"], r["n_shot"], r["seed"]) for r in lines)
            == sorted(_all_units()))
    runs = {_key(c): c.run.dir for c in fake.cfgs}
    for r in lines:
        key = (r["method"], r["mode"], r["n_shot"], r["seed"])
        assert r["kind"] == "ner"
        assert r["test_f1"] == test_f1(*key)
        assert r["best_dev_f1"] == dev_f1(*key)
        assert r["best_step"] == 20 + key[3]
        assert r["train_sentences"] == 3 * key[2]
        assert r["curve"] == [[c["step"], c["dev_f1"], c["test_f1"]] for c in curve(*key)]
        assert exp.out / r["run"] == Path(runs[key])  # relative to the experiment
    assert sorted(map(json.dumps, exp.rows())) == sorted(map(json.dumps, lines))


def test_second_run_trains_nothing_and_adds_no_row(finished, tmp_path, ner_dir, monkeypatch):
    exp, _ = finished
    before = {p.name: p.read_text() for p in exp.results.iterdir()}
    again = FakeTrain()
    monkeypatch.setattr(ff, "_timed", again)
    Experiment.open(tmp_path / "exp", _plan(ner_dir)).run()
    Experiment.open(tmp_path / "exp", None).run()  # the saved plan, as `run --out DIR`
    assert again.cfgs == []
    assert {p.name: p.read_text() for p in exp.results.iterdir()} == before


def test_interrupted_run_resumes_with_only_the_missing_units(tmp_path, ner_dir, monkeypatch):
    out = tmp_path / "exp"
    k = 5
    broken = FakeTrain(fail_after=k)
    monkeypatch.setattr(ff, "_timed", broken)
    with pytest.raises(RuntimeError, match="run the command again"):
        Experiment.open(out, _plan(ner_dir)).run()
    exp = Experiment.open(out, None)
    assert [(r["method"], r["mode"], r["n_shot"], r["seed"]) for r in _lines(exp)] == _all_units()[:k]

    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    Experiment.open(out, _plan(ner_dir)).run()
    assert [_key(c) for c in fake.cfgs] == _all_units()[k:]
    lines = _lines(exp)
    assert (sorted((r["method"], r["mode"], r["n_shot"], r["seed"]) for r in lines)
            == sorted(_all_units()))
    assert all(r["test_f1"] == test_f1(r["method"], r["mode"], r["n_shot"], r["seed"])
               for r in lines)


def test_open_refuses_another_plan_and_needs_one_to_start(finished, tmp_path, ner_dir):
    out = tmp_path / "exp"
    plan = _plan(ner_dir)
    with pytest.raises(ConfigError, match=r"^trials: .*differs in trials"):
        Experiment.open(out, replace(plan, trials=3))
    with pytest.raises(ConfigError, match=r"^shots: "):
        Experiment.open(out, replace(plan, shots=(2, 8)))
    with pytest.raises(ConfigError, match=r"^finetune: "):
        Experiment.open(out, replace(plan, finetune={"run.steps": 6, "optim.lr": 1e-3}))
    with pytest.raises(ConfigError, match=r"^backbone: "):
        Experiment.open(out, replace(plan, backbone="/elsewhere"))
    # the same plan, or none: the saved one (tuples survive the JSON round trip)
    assert Experiment.open(out, plan).plan == plan
    assert Experiment.open(out, None).plan == plan

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no experiment"):
        Experiment.open(empty, None)
    assert list(empty.iterdir()) == []


def test_plan_validation(ner_dir):
    with pytest.raises(ConfigError, match="^backbone:"):
        Plan(ner_dir=ner_dir, backbone="", pretrain={})
    with pytest.raises(ConfigError, match="^methods:"):
        _plan(ner_dir, methods=("base", "lstm"))
    with pytest.raises(ConfigError, match="^modes:"):
        _plan(ner_dir, modes=("fe", "zs"))
    with pytest.raises(ConfigError, match="^shots:"):
        _plan(ner_dir, shots=(0, 4))
    with pytest.raises(ConfigError, match="^trials:"):
        _plan(ner_dir, trials=0)


# ------------------------------------------------------------------------------ 2. pretraining


def test_without_backbone_pretrains_once_on_the_ner_sentences(tmp_path, ner_dir, monkeypatch):
    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    out = tmp_path / "exp"
    pre = PRESETS["miniature"]["pretrain"]
    plan = Plan(ner_dir=ner_dir, backbone="", methods=("dwatt",), modes=("ft",), shots=(2,),
                trials=1, finetune={"run.steps": 5}, pretrain=pre)
    exp = Experiment.open(out, plan)

    backbone = exp.backbone()
    assert backbone == str(out / "pretrain")
    corpus = out / "pretrain_corpus.txt"
    sents = [" ".join(t for t, _ in s) for s in TRAIN]  # 10 sentences: documents of 8 and 2
    assert corpus.read_text() == "\n".join(sents[:8]) + "\n\n" + "\n".join(sents[8:]) + "\n"
    assert corpus.read_text().startswith("Anna lives in Oslo\nBob Smith\nIBM hires\n")

    assert len(fake.cfgs) == 1
    cfg = fake.cfgs[0]
    assert cfg.model.arch == "encoder" and cfg.task.name == ""
    assert cfg.data.corpus == str(corpus)
    assert cfg.run.dir == str(out / "pretrain") and cfg.run.progress is False
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.vocab_size) == (128, 4, 2000)
    assert cfg.run.steps == pre["run.steps"] == 600 and cfg.data.max_predictions == 10

    # summary.json is there now: neither backbone() nor run() pretrains again
    assert exp.backbone() == backbone and len(fake.cfgs) == 1
    exp.run()
    assert len(fake.cfgs) == 2
    unit = fake.cfgs[1]
    assert unit.task.name == "ner" and unit.task.init_from == str(out / "pretrain")
    assert _key(unit) == ("dwatt", "ft", 2, 0)
    Experiment.open(out, None).run()
    assert len(fake.cfgs) == 2


def test_interrupted_pretraining_runs_again(tmp_path, ner_dir, monkeypatch):
    """Pretraining without summary.json (it failed) is redone; the corpus is reused."""
    monkeypatch.setattr(ff, "_timed", FakeTrain(fail_after=0))
    out = tmp_path / "exp"
    plan = Plan(ner_dir=ner_dir, methods=("base",), modes=("fe",), shots=(2,), trials=1,
                pretrain=PRESETS["miniature"]["pretrain"])
    with pytest.raises(RuntimeError):
        Experiment.open(out, plan).run()
    assert (out / "pretrain_corpus.txt").is_file() and not (out / "results").exists()
    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    Experiment.open(out, plan).run()
    assert [c.model.arch for c in fake.cfgs][:1] == ["encoder"] and len(fake.cfgs) == 2


# ------------------------------------------------------------------------------ 3. report


def _hand(value_fn, method, mode, n):
    """(mean, 95% CI half-width) over the 2 trials by hand: s = |a - b| / sqrt(2), so
    half-width = t * s / sqrt(2) = t * |a - b| / 2."""
    a, b = (value_fn(method, mode, n, t) for t in range(TRIALS))
    return (a + b) / 2, T1 * abs(a - b) / 2


def test_mean_ci95_matches_a_hand_value():
    mean, ci = mean_ci95([0.5, 0.7])
    assert mean == pytest.approx(0.6)
    assert ci == pytest.approx(12.706 * 0.1, rel=1e-4)  # s = 0.1414, t * s / sqrt(2)
    mean, ci = mean_ci95([1.0, 2.0, 3.0])  # s = 1, t_{0.975}(2) = 4.303
    assert (mean, ci) == (pytest.approx(2.0), pytest.approx(4.303 / math.sqrt(3), rel=1e-3))


def _md_rows(md: str) -> dict:
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| mode"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


@pytest.mark.parametrize("value_key,value_fn", [("test_f1", test_f1), ("best_dev_f1", dev_f1)])
def test_table_cells_are_mean_and_ci_over_trials(finished, value_key, value_fn):
    exp, _ = finished
    md, csv_text = fusion_report.table(exp.rows(), value_key)
    assert "| mode | method | N=2 | N=4 |" in md
    assert "over 2 trials" in md
    rows = _md_rows(md)
    assert list(rows) == [("FE", "base"), ("FE", "dwatt"), ("FT", "base"), ("FT", "dwatt")]
    parsed = list(csv.reader(io.StringIO(csv_text)))
    assert parsed[0] == ["mode", "method", "2", "4"]
    csv_rows = {(r[0], r[1]): r[2:] for r in parsed[1:]}
    assert list(csv_rows) == [("fe", "base"), ("fe", "dwatt"), ("ft", "base"), ("ft", "dwatt")]
    for mode in MODES:
        for m in METHODS:
            cells, csv_cells = rows[(mode.upper(), m)], csv_rows[(mode, m)]
            for j, n in enumerate(SHOTS):
                mean, ci = _hand(value_fn, m, mode, n)
                assert cells[j] == f"{100 * mean:.1f} ± {100 * ci:.1f}"
                assert float(csv_cells[j]) == pytest.approx(100 * mean, abs=0.006)
    # one cell spelled out: FE base N=2, test F1 0.32123 and 0.34463
    if value_key == "test_f1":
        assert rows[("FE", "base")][0] == "33.3 ± 14.9" and csv_rows[("fe", "base")][0] == "33.29"


def test_f1_vs_shots_series_are_hand_means(finished, tmp_path):
    exp, _ = finished
    path, series = fusion_report.f1_vs_shots(exp.rows(), tmp_path / "fig" / "f3.png")
    assert path.is_file() and path.stat().st_size > 0
    assert set(series) == {f"{mo}/{m}" for mo in MODES for m in METHODS}
    for mo in MODES:
        for m in METHODS:
            s = series[f"{mo}/{m}"]
            assert s["x"] == list(SHOTS)
            hand = [_hand(test_f1, m, mo, n) for n in SHOTS]
            assert s["mean"] == pytest.approx([100 * mean for mean, _ in hand], abs=1e-9)
            assert s["ci95"] == pytest.approx([100 * ci for _, ci in hand], rel=1e-9)


def test_f1_vs_step_averages_the_curves_over_trials(finished, tmp_path):
    exp, _ = finished
    rows = exp.rows()
    path, series = fusion_report.f1_vs_step(rows, tmp_path / "f4.png")
    assert path.is_file()
    assert set(series) == {f"{mo}/{m}" for mo in MODES for m in METHODS}
    for mo in MODES:
        for m in METHODS:
            s = series[f"{mo}/{m}"]
            # the largest N (4); step 40 only in trial 1, so left out
            assert s["x"] == list(STEPS) and s["n"] == TRIALS
            c0, c1 = (curve(m, mo, 4, t) for t in range(TRIALS))
            hand = [100 * (c0[i]["dev_f1"] + c1[i]["dev_f1"]) / 2 for i in range(len(STEPS))]
            assert s["mean"] == pytest.approx(hand, abs=1e-9)
    _, small = fusion_report.f1_vs_step(rows, tmp_path / "f4_n2.png", n_shot=2)
    c0, c1 = (curve("dwatt", "ft", 2, t) for t in range(TRIALS))
    assert small["ft/dwatt"]["mean"] == pytest.approx(
        [100 * (a["dev_f1"] + b["dev_f1"]) / 2 for a, b in zip(c0, c1)], abs=1e-9)


def test_write_report_writes_tables_and_figures(finished, tmp_path):
    exp, _ = finished
    out = tmp_path / "report"
    paths = fusion_report.write_report(exp.rows(), out)
    assert set(paths) == {"table_test_f1", "table_dev_f1", "fig3", "fig4"}
    for name in ("table_test_f1", "table_dev_f1"):
        assert paths[name] == out / f"{name}.md"
        assert (out / f"{name}.md").read_text() == fusion_report.table(
            exp.rows(), "test_f1" if name == "table_test_f1" else "best_dev_f1")[0]
        assert (out / f"{name}.csv").is_file()
    for name in ("fig3_f1_vs_shots.png", "fig4_f1_vs_step.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FileNotFoundError, match="no finished units"):
        fusion_report.write_report([], tmp_path / "empty_report")


def test_main_report(finished, tmp_path, ner_dir, capsys):
    assert ff.main(["report", "--out", str(tmp_path / "exp")]) == 0
    rep = tmp_path / "exp" / "report"
    for name in ("table_test_f1.md", "table_test_f1.csv", "table_dev_f1.md", "table_dev_f1.csv",
                 "fig3_f1_vs_shots.png", "fig4_f1_vs_step.png"):
        assert (rep / name).is_file()
    assert "33.3 ± 14.9" in (rep / "table_test_f1.md").read_text()

    # a started experiment without finished units, and a directory with no experiment
    Experiment.open(tmp_path / "started", _plan(ner_dir))
    capsys.readouterr()
    assert ff.main(["report", "--out", str(tmp_path / "started")]) == 2
    assert "no finished units" in capsys.readouterr().err
    assert ff.main(["report", "--out", str(tmp_path / "nothing")]) == 2
    assert "no experiment" in capsys.readouterr().err


# ------------------------------------------------------------------------------ 4. CLI


def test_main_run_needs_ner_dir_to_start(tmp_path, capsys, monkeypatch):
    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    assert ff.main(["run", "--out", str(tmp_path / "fresh")]) == 2
    assert "--ner-dir" in capsys.readouterr().err
    assert not (tmp_path / "fresh" / "plan.json").exists() and fake.cfgs == []


def test_plan_from_args_presets_and_overrides(tmp_path, ner_dir):
    base = ["run", "--out", str(tmp_path / "x"), "--ner-dir", ner_dir]
    mini = PRESETS["miniature"]
    p = ff.plan_from_args(ff.parse(base + ["--preset", "miniature", "--finetune", "run.steps=7"]))
    assert p.shots == mini["shots"] == (8, 16, 32, 64, 128) and p.trials == mini["trials"] == 2
    assert p.finetune["run.steps"] == 7 and mini["finetune"]["run.steps"] == 150
    assert {k: v for k, v in p.finetune.items() if k != "run.steps"} == {
        k: v for k, v in mini["finetune"].items() if k != "run.steps"}
    assert p.pretrain == mini["pretrain"] and p.backbone == ""
    # every method of models/fusions/, the paper's four in the paper's order among them
    from jaxdepth.models.fusions import fusion_methods
    assert p.methods == fusion_methods() and p.modes == ("fe", "ft")
    assert [m for m in p.methods if m in ("base", "base+n", "concat", "dwatt")] == [
        "base", "base+n", "concat", "dwatt"]

    p = ff.plan_from_args(ff.parse(base + ["--preset", "miniature", "--trials", "3",
                                           "--shots", "4", "2", "--pretrain", "run.steps=50"]))
    assert p.trials == 3 and p.shots == (4, 2)
    assert p.pretrain == {**mini["pretrain"], "run.steps": 50}
    assert p.finetune == mini["finetune"]

    p = ff.plan_from_args(ff.parse(base + ["--backbone", "/bb", "--methods", "dwatt",
                                           "--modes", "ft"]))
    assert p.backbone == "/bb" and p.pretrain == {} and p.methods == ("dwatt",)
    assert p.shots == PRESETS["paper"]["shots"] and p.trials == 5
    assert p.finetune == PRESETS["paper"]["finetune"]

    assert ff.plan_from_args(ff.parse(["report", "--out", str(tmp_path / "x")])) is None
    with pytest.raises(ConfigError, match="--finetune"):
        ff.plan_from_args(ff.parse(base + ["--finetune", "run.nosuch=1"]))


def test_main_all_end_to_end_with_fake_training(tmp_path, ner_dir, monkeypatch, capsys):
    fake = FakeTrain()
    monkeypatch.setattr(ff, "_timed", fake)
    out = tmp_path / "e2e"
    argv = ["all", "--out", str(out), "--ner-dir", ner_dir, "--backbone", BACKBONE,
            "--methods", "base", "dwatt", "--shots", "2", "4", "--trials", "2",
            "--finetune", "run.steps=5", "optim.lr=0.001"]
    assert ff.main(argv) == 0
    assert [_key(c) for c in fake.cfgs] == _all_units()
    assert (out / "report" / "table_test_f1.md").is_file()
    # same plan again: nothing to train; another plan for this directory: refused
    assert ff.main(argv) == 0 and len(fake.cfgs) == 16
    capsys.readouterr()
    assert ff.main(argv[:-2] + ["run.steps=6"]) == 2
    assert "finetune" in capsys.readouterr().err
    assert ff.main(["run", "--out", str(out)]) == 2  # run needs --ner-dir even to continue
