"""benchmarks/bench_act.py on a tiny model: depths at the extreme biases, while == scan, one
compile per path for the whole bias sweep, and the JSON it writes."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_act  # noqa: E402

M = 4


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_act") / "act.json"
    res = bench_act.main(["--d-model", "32", "--n-heads", "2", "--embed-dim", "16",
                          "--max-iters", str(M), "--biases", "30,0,-30", "--seq-len", "16",
                          "--batch", "4", "--repeats", "2", "--warmup", "1", "--out", str(out)])
    return res, out


def test_json_written(result):
    res, out = result
    disk = json.loads(out.read_text())
    assert disk["benchmark"] == "bench_act" and disk["max_iters"] == M
    assert disk["config"]["d_model"] == 32 and disk["config"]["max_iters"] == M
    assert [r["bias"] for r in disk["records"]] == [30.0, 0.0, -30.0]
    for key in ("jax", "backend", "device_kind", "compile_counts", "scan_time_independent_of_bias",
                "target_met_all"):
        assert key in disk, key
    for r in disk["records"]:
        for key in ("mean_N", "iterations_run", "t_while", "t_scan", "t_fixed", "t_embed",
                    "ratio_while_over_fixed", "expected", "within_target", "adjusted_ratio",
                    "max_abs_diff"):
            assert key in r, key
        assert r["t_while"] > 0 and r["t_scan"] > 0 and r["t_fixed"] > 0 and r["t_embed"] > 0
        assert r["expected"] == r["iterations_run"] / M
        assert r["within_target"] == (r["t_while"] <= 1.15 * r["expected"] * r["t_fixed"])
        assert r["ratio_while_over_fixed"] == pytest.approx(r["t_while"] / r["t_fixed"])
    assert disk["compile_counts"] == res["compile_counts"]


def test_extreme_biases_set_the_depth(result):
    recs = {r["bias"]: r for r in result[0]["records"]}
    shallow, deep = recs[30.0], recs[-30.0]
    assert shallow["iterations_run"] == 1 and shallow["mean_N"] == 1.0
    assert deep["iterations_run"] == M and deep["mean_N"] == float(M)
    assert 1.0 <= recs[0.0]["mean_N"] <= recs[0.0]["iterations_run"] <= M
    for r in recs.values():
        assert r["iterations_run"] == r["iterations_run_scan"]


def test_while_equals_scan(result):
    for r in result[0]["records"]:
        assert r["max_abs_diff"] < 1e-5, r["max_abs_diff_parts"]
        assert r["max_abs_diff_parts"]["N"] == 0 and r["max_abs_diff_parts"]["iterations_run"] == 0


def test_one_compile_per_path_for_the_sweep(result):
    res = result[0]
    assert set(res["compile_counts"]) >= {"while", "scan", "fixed", "embed"}
    assert all(n == 1 for n in res["compile_counts"].values()), res["compile_counts"]
    assert res["one_compile_per_path"]
    assert all(n in (None, 1) for n in res["jit_cache_sizes"].values())
