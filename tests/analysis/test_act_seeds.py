"""ACT's Table 1 over seeds (analysis/act_seeds.py): intervals over seeds, paired differences,
which files a run contributes, and one-line refusals."""
import json
import math

import pytest

from jaxdepth.analysis import act_seeds
from jaxdepth.analysis.act_stats import GROUPS
from jaxdepth.errors import DataError

T_975_DF2 = 4.302653  # t_{0.975} with 2 degrees of freedom (3 seeds)


def table(all_n: float, sep_n: float, mlm: float = 0.2, tokens_sep: int = 256) -> dict:
    it = {g: all_n for g in GROUPS}
    it["[SEP]"] = sep_n
    it["[MASK/random]"] = None if all_n > 9 else all_n  # "never seen" by the seed marked so
    tokens = {g: 100 for g in GROUPS}
    tokens["[SEP]"] = tokens_sep
    return {"mlm_accuracy": mlm, "sop_accuracy": 0.5, "iterations": it, "tokens": tokens}


def test_interval_is_over_seeds_and_difference_is_paired():
    tables = [table(2.0, 2.5), table(2.2, 2.6), table(2.4, 2.9)]
    t = act_seeds.seed_table(tables)
    sep = t["iterations"]["[SEP]"]
    mean = (2.5 + 2.6 + 2.9) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in (2.5, 2.6, 2.9)) / 2)
    assert sep["mean"] == pytest.approx(mean, rel=1e-12)
    assert sep["ci95"] == pytest.approx(T_975_DF2 * sd / math.sqrt(3), rel=1e-6)
    assert sep["seeds"] == [2.5, 2.6, 2.9]
    # paired: [SEP] - all per seed is 0.5, 0.4, 0.5, far narrower than [SEP]'s own spread
    d = t["minus_all"]["[SEP]"]
    assert d["mean"] == pytest.approx(1.4 / 3, rel=1e-12)
    sd_d = math.sqrt(sum((x - 1.4 / 3) ** 2 for x in (0.5, 0.4, 0.5)) / 2)
    assert d["ci95"] == pytest.approx(T_975_DF2 * sd_d / math.sqrt(3), rel=1e-6)
    assert d["ci95"] < sep["ci95"]
    assert "all" not in t["minus_all"]
    assert t["tokens"]["[SEP]"] == 256


def test_group_missing_in_a_seed_is_left_out_and_unequal_counts_are_listed():
    tables = [table(2.0, 2.5, tokens_sep=256), table(10.0, 2.6, tokens_sep=250)]
    t = act_seeds.seed_table(tables)
    assert "[MASK/random]" not in t["iterations"]
    assert t["tokens"]["[SEP]"] == [256, 250]
    assert "[MASK/random]" not in act_seeds.format_seed_table(t)


def test_one_seed_is_refused():
    with pytest.raises(DataError, match="at least 2"):
        act_seeds.seed_table([table(2.0, 2.5)])


def write(path, t):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"table1": t, "roles": {}}))


def test_trials_in_trial_order_then_solo_runs(tmp_path, capsys):
    trials = tmp_path / "five"
    for k, n in [(10, 2.4), (2, 2.2), (0, 2.0)]:
        write(trials / "trials" / str(k) / "analysis" / "table1.json", table(n, n + 0.5))
    write(trials / "trials" / "notes" / "analysis" / "table1.json", table(9.0, 9.0))  # not a trial
    solo = tmp_path / "solo"
    write(solo / "analysis" / "table1.json", table(2.6, 3.1))
    assert [p.parent.parent.name for p in act_seeds.table1_files(trials)] == ["0", "2", "10"]
    out = tmp_path / "report"
    assert act_seeds.main([str(trials), str(solo), "--out", str(out)]) == 0
    got = json.loads((out / "table1_seeds.json").read_text())
    assert got["iterations"]["all"]["seeds"] == [2.0, 2.2, 2.4, 2.6]
    assert "| [SEP] | 256 | 2.800 ± 0.411 | +0.500 ± 0.000 | 2.500, 2.700, 2.900, 3.100 |" in (
        out / "table1_seeds.md").read_text()
    assert "over 4 seeds" in capsys.readouterr().out


def test_a_run_without_table_is_one_line(tmp_path, capsys):
    assert act_seeds.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(tmp_path) in err and "\n" not in err
    good = tmp_path / "good"
    write(good / "analysis" / "table1.json", table(2.0, 2.5))
    for name, text in [("empty", "{}"), ("unscored", json.dumps({"table1": {
            **table(2.0, 2.5), "mlm_accuracy": None}})), ("binary", b"\xff\xfe")]:
        bad = tmp_path / name / "analysis" / "table1.json"
        bad.parent.mkdir(parents=True)
        bad.write_bytes(text if isinstance(text, bytes) else text.encode())
        assert act_seeds.main([str(good), str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert "not a Table 1" in err and name in err and "\n" not in err
    assert act_seeds.main([str(good), str(good)]) == 2
    assert "given twice" in capsys.readouterr().err
