"""Smoke and numbers tests for benchmarks/: bench_step's record, bench_trials' record; and the
process that runs test_vs_torch.py (the PyTorch reference of bench_vs_torch)."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_batch_sum  # noqa: E402
import bench_step  # noqa: E402
import bench_trials  # noqa: E402

from jaxdepth.config import MeshConfig, ModelConfig
from jaxdepth.models.depth_family import depth_family


def analytic_flops_per_token(m: ModelConfig, T: int) -> int:
    """PaLM App. B, written out independently: 6 * matmul params + 12 * L * T * d_attn."""
    d, f, L, V = m.d_model, m.d_ff, m.n_layers, m.vocab_size
    attn = 4 * d * d  # wq, wk, wv, wo (d_attn = d_model)
    mlp = 3 * d * f  # wi_0, wi_1, wo
    return 6 * (L * (attn + mlp) + d * V) + 12 * L * T * d


def test_bench_member_record():
    m = depth_family("tiny")[3]
    rec = bench_step.bench_member(m, seq_len=16, batch=4, steps=2, warmup=1,
                                  mesh=MeshConfig(data=1), peak_flops=1e9, peak_source="test")
    json.dumps(rec)  # JSON-able
    for key in ("compile_s", "first_call_s", "step_s_mean", "step_s_median", "tokens_per_s",
                "flops_per_token", "mfu", "peak_flops_per_device", "peak_source",
                "peak_memory_bytes", "peak_memory_kind", "params", "final_loss"):
        assert key in rec, key
    assert len(rec["step_s_all"]) == 2 and all(t > 0 for t in rec["step_s_all"])
    assert rec["compile_s"] > 0 and rec["first_call_s"] >= rec["compile_s"]
    assert rec["flops_per_token"] == analytic_flops_per_token(m, 16)
    # model.d_ff_multiple -1 pads only off the CPU; the FLOPs above are d_ff's either way
    assert (rec["d_ff"], rec["d_ff_multiple"], rec["d_ff_padded"]) == (142, -1, 142)
    assert rec["tokens_per_s"] == pytest.approx(4 * 16 / rec["step_s_median"])
    assert rec["mfu"] == pytest.approx(rec["tokens_per_s"] * rec["flops_per_token"] / 1e9)
    assert rec["peak_memory_bytes"] > 0
    # random tokens, fresh model: the loss is finite and of the order of log(V)
    assert math.isfinite(rec["final_loss"]) and rec["final_loss"] < 3 * math.log(m.vocab_size)


@pytest.mark.parametrize("vmapped", [False, True])
def test_bench_batch_sum_compares_the_two_sums(vmapped):
    """Both sums of the same slices, and bit_equal as NumPy finds it (float32, one add at a
    time for the adds, per trial when vmapped; XLA's reduction read back)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    g = (rng.standard_normal((2, 6, 3, 8, 8) if vmapped else (6, 3, 8, 8))
         * 10.0 ** rng.integers(-3, 4, (6, 1, 1, 1))).astype(np.float32)
    row = bench_batch_sum.measure(jnp.asarray(g), vmapped, reps=1)
    assert row["reduce_ms"] > 0 and row["adds_ms"] > 0
    slices = np.moveaxis(g, 1, 0) if vmapped else g
    adds = slices[0].copy()
    for s in slices[1:]:
        adds = (adds + s).astype(np.float32)
    red = np.asarray(jax.jit(lambda g: jnp.sum(g, 1 if vmapped else 0))(g))
    assert row["bit_equal"] == bool(np.array_equal(adds, red))


def test_bench_step_main_writes_json(tmp_path):
    out = tmp_path / "r.json"
    res = bench_step.main(["--family", "tiny", "--depths", "1,4", "--seq-len", "16",
                           "--batch", "8", "--steps", "2", "--warmup", "1", "--no-isolate",
                           "--out", str(out)])
    disk = json.loads(out.read_text())
    assert disk["compile_ratio_deepest_over_shallowest"] == pytest.approx(
        res["members"][-1]["compile_s"] / res["members"][0]["compile_s"])
    assert [r["n_layers"] for r in disk["members"]] == [1, 4]
    assert disk["peak_source"] and disk["peak_flops_per_device"] > 0
    # Fig. 9: the latency table holds each member's median seconds per step
    table = (tmp_path / "r_latency.md").read_text().splitlines()[2:]
    for line, rec in zip(table, disk["members"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert int(cells[0]) == rec["n_layers"]
        assert float(cells[3]) == pytest.approx(rec["step_s_median"], abs=5e-5)
    assert (tmp_path / "r_latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_trials_quick_json_consistent(tmp_path):
    """K = 1, 2 trials of the tiny model on grammar batches: every derived number is computed
    from the reported times (the times themselves are not asserted), and trial 0 is the solo
    run of seed 0 (same first loss)."""
    out = tmp_path / "t.json"
    res = bench_trials.main(["--quick", "--ks", "1,2", "--models", "tiny", "--steps", "2",
                             "--mesh-data", "1", "--out", str(out)])
    disk = json.loads(out.read_text())
    assert disk == json.loads(json.dumps(res))
    assert disk["benchmark"] == "bench_trials" and disk["quick"] and disk["steps"] == 2
    assert disk["complete"] and disk["wall_s"] > 0
    assert disk["data"].startswith("grammar")
    for key in ("jax", "backend", "device_kind", "cpu_count", "measured_fp32_matmul_flops"):
        assert key in disk, key
    # the K=8 target is not measured by this run, and says so
    assert disk["target_k8_tiny_le_3x"] is None and disk["target_k8_tiny_ratio"] is None
    (m,) = disk["models"]
    assert m["model"] == "tiny" and m["preset"] == "tiny-L2" and m["n_layers"] == 2
    assert (m["seq_len"], m["batch"], m["devices"]) == (32, 8, 1)
    assert [r["k"] for r in m["ks"]] == [1, 2] and m["skipped"] == []
    for r in m["ks"]:
        k = r["k"]
        assert len(r["trial_step_ms_all"]) == 2 and len(r["solo_step_ms_all"]) == 2
        assert all(t > 0 for t in r["trial_step_ms_all"] + r["solo_step_ms_all"])
        assert r["trial_step_ms"] > 0 and r["solo_step_ms"] > 0 and r["compile_s"] > 0
        assert r["trial_step_ms_min"] <= r["trial_step_ms"] <= max(r["trial_step_ms_all"])
        assert r["ratio"] == pytest.approx(r["trial_step_ms"] / r["solo_step_ms"])
        assert r["speedup"] == pytest.approx(k * r["solo_step_ms"] / r["trial_step_ms"])
        assert r["speedup"] == pytest.approx(k / r["ratio"])
        assert r["trials_per_s"] == pytest.approx(1e3 * k / r["trial_step_ms"])
        assert r["tokens_per_s"] == pytest.approx(1e3 * k * 32 * 8 / r["trial_step_ms"])
        assert r["achieved_flops_per_s"] == pytest.approx(r["tokens_per_s"] * m["flops_per_token"])
        assert r["first_loss_trial0"] == pytest.approx(r["first_loss_solo"], rel=1e-5)
        assert math.isfinite(r["first_loss_solo"]) and r["final_losses_finite"]
        assert r["frozen"] == 0 and r["step_new_bytes"] > 0


def test_bench_trials_act_record(tmp_path):
    """The ACT encoder (act-cpu) through the same step part: its shape is the act section's
    (M = 6 iterations as layers, d_ff 0 read as 4 x 128), its FLOPs the encoder's (6 x the
    layer's weights + 12 T d per iteration, M iterations, plus the embedding projection; the
    model section's defaults would give the default decoder's), and its trial 0 is its solo
    run."""
    res = bench_trials.main(["--quick", "--ks", "1", "--models", "act", "--steps", "1",
                             "--mesh-data", "1", "--out", str(tmp_path / "a.json")])
    (m,) = res["models"]
    assert (m["preset"], m["n_layers"], m["d_model"], m["d_ff"], m["vocab_size"]) == (
        "act-cpu", 6, 128, 512, 512)
    per_iter = 2 * 3 * (4 * 128 * 128 + 2 * 128 * 512) + 12 * 32 * 128  # weights + attention
    assert m["flops_per_token"] == 6 * per_iter + 6 * 128 * 128  # + the embedding projection
    (r,) = m["ks"]
    assert r["first_loss_trial0"] == pytest.approx(r["first_loss_solo"], rel=1e-5)


def test_drift_by_hand():
    from common import drift

    a = {"u1": {"f1": 0.5, "step": 4, "loss": float("nan")},
         "u2": {"f1": 0.25, "step": 2, "acc": None}, "only_a": {"f1": 1.0}}
    b = {"u1": {"f1": 0.5, "step": 4, "loss": 1.0},
         "u2": {"f1": 0.125, "step": 6, "acc": 0.5}, "only_b": {"f1": 0.0}}
    assert drift(a, b) == {"only_in_one": ["only_a", "only_b"], "units_compared": 2,
                           "units_that_differ": 2,
                           "largest_abs_difference": {"f1": 0.125, "step": 4.0},
                           "fields_not_compared": ["acc", "loss"]}


def test_last_list_and_the_backbone_command(tmp_path, monkeypatch):
    """The uncached grid repeats the last --finetune list (argparse keeps the last one), in
    either spelling; the untimed pretraining is the experiment's own command, one FT unit."""
    import common

    argv = ["x", "--finetune", "a=1", "b=2", "--methods", "dwatt", "--finetune=c=3", "d=4"]
    assert common.last_list(argv, "--finetune") == ["c=3", "d=4"]
    assert common.last_list(argv[:5], "--finetune") == ["a=1", "b=2"]
    assert common.last_list(["x"], "--finetune") == []
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    base = common.fewshot_grid_command("NER", "--shots 8 --trials 1")
    assert base[1:] == ["-m", "jaxdepth.experiments.fusion_fewshot", "all", "--ner-dir", "NER",
                        "--preset", "miniature", "--modes", "fe", "--shots", "8", "--trials", "1"]
    assert common.fewshot_backbone(base, tmp_path) == str(tmp_path / "pretrain_only" / "pretrain")
    assert ran == [base + ["--out", str(tmp_path / "pretrain_only"), "--methods", "base",
                           "--shots", "8", "--modes", "ft", "--trials", "1"]]


def test_sweep_units_read_a_sweep_directory(tmp_path):
    rows = [{"kind": "pretrain", "depth": 2, "seed": 1, "valid_ppl": 8.5, "valid_loss": 2.14,
             "step": 400},
            {"kind": "finetune", "task": "passivization", "depth": 2, "seed": 1,
             "init": "final", "dev_loss": 0.02, "id_accuracy": 0.93, "gen_accuracy": 0.31,
             "lexical": 0.59, "structural": 0.04, "by_type": {}},
            {"kind": "equal_loss", "task": "passivization", "depth": 2, "seed": 1}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench_trials.sweep_units(tmp_path) == {
        "pretrain L2 s1": {"valid_ppl": 8.5, "valid_loss": 2.14},
        "finetune passivization L2 s1 final": {"dev_loss": 0.02, "id_accuracy": 0.93,
                                               "gen_accuracy": 0.31, "lexical": 0.59,
                                               "structural": 0.04}}


def test_bench_trials_runs_each_experiment_both_ways(tmp_path, monkeypatch):
    """The grid and slice parts: the commands each way runs (the experiment's own command,
    with --sequential and without), and the record's speedup and drift computed from what
    the two runs gave (the runs themselves are replaced: each is minutes of training)."""
    calls = []
    walls = {"grid": {"sequential": 100.0, "trials": 16.0},
             "slice": {"sequential": 60.0, "trials": 75.0}}
    results = {"sequential": {"u": {"f1": 0.5}}, "trials": {"u": {"f1": 0.5 + 2 ** -20}}}

    def two_ways(base, ways, work, units):
        part = "grid" if "fusion_fewshot" in " ".join(base) else "slice"
        calls.append((part, base, ways))
        return {w: {"wall_s": walls[part][w], "units": 1, "results": results[w]} for w in ways}

    monkeypatch.setattr(bench_trials, "two_ways", two_ways)
    monkeypatch.setattr(bench_trials, "fewshot_backbone", lambda base, work: "BACKBONE")
    out = tmp_path / "e.json"
    res = bench_trials.main(["--parts", "grid,slice", "--ner-dir", "NER", "--slice-extra",
                             "--seeds 0,1", "--workdir", str(tmp_path / "w"), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res["models"] == [] and res["parts"] == ["grid", "slice"]
    (_, grid, gw), (_, sl, sw) = calls
    assert gw == sw == {"sequential": ["--sequential"], "trials": []}
    assert grid[1:] == ["-m", "jaxdepth.experiments.fusion_fewshot", "all", "--ner-dir", "NER",
                        "--preset", "miniature", "--modes", "fe", "--backbone", "BACKBONE"]
    assert sl[1:] == ["-m", "jaxdepth.experiments.depth_sweep", "run", "--preset", "miniature",
                      "--depths", "2", "--seeds", "0,1,2,3", "--tasks", "passivization",
                      "--scratch", "none", "--seeds", "0,1"]
    assert res["grid"]["speedup"] == pytest.approx(100 / 16) and res["grid"]["within_target"]
    assert res["grid"]["target_speedup"] == 5.0 and res["grid"]["backbone"] == "BACKBONE"
    assert res["slice"]["speedup"] == pytest.approx(60 / 75) and "within_target" not in res["slice"]
    assert res["slice"]["drift"] == {"only_in_one": [], "units_compared": 1,
                                     "units_that_differ": 1,
                                     "largest_abs_difference": {"f1": 2 ** -20},
                                     "fields_not_compared": []}
    with pytest.raises(SystemExit, match="needs --ner-dir"):
        bench_trials.main(["--parts", "grid", "--out", str(out)])


# ----------------------------------------------------------------------------- torch reference

def test_torch_reference_in_a_process_of_its_own():
    """test_vs_torch.py, in a fresh interpreter: torch never enters a long-lived test worker."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the bench extra)")
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "JAXDEPTH_TORCH_PROCESS": "1"}  # see conftest.collect_ignore
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-o", "addopts=", str(tests / "benchmarks" / "test_vs_torch.py")],
                       cwd=tests.parent, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " skipped" not in r.stdout, r.stdout[-2000:]
