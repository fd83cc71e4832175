"""gpu_report.py: what benchmarks/gpu.sh wrote, merged into gpu.json (issue 38, item 6)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_report  # noqa: E402


def _member(layers: int, d_ff: int, step_s: float, mfu: float) -> dict:
    return {"n_layers": layers, "d_ff": d_ff, "d_ff_padded": -(-d_ff // 128) * 128,
            "attention": "cudnn", "params": 134_300_000, "devices": 1, "seq_len": 1024,
            "batch": 32, "step_s_median": step_s, "tokens_per_s": 32 * 1024 / step_s,
            "mfu": mfu, "peak_flops_per_device": 989e12, "peak_source": "datasheet",
            "compile_s": 60.0 + layers, "peak_memory_bytes": 3 * 2**30, "d_model": 768,
            "n_heads": 12, "vocab_size": 32128, "compute_dtype": "bfloat16", "remat": "none"}


def test_gpu_json_holds_each_member_and_the_sweep(tmp_path):
    (tmp_path / "step").mkdir()
    for name, m in {"cudnn_L1": _member(1, 35847, 0.0512, 0.432),
                    "cudnn_L12": _member(12, 2048, 0.1044, 0.245)}.items():
        (tmp_path / "step" / f"{name}.json").write_text(json.dumps(
            {"members": [m], "attention": "cudnn", "device_kind": "NVIDIA H100 80GB HBM3",
             "jax": "0.11.2", "backend": "gpu"}))
    sweep = tmp_path / "sweep45"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps(
        {"seeds": list(range(45)), "depths": [2, 4], "tasks": ["semantic_parsing"],
         "scratch": [4]}))
    rows = [{"kind": "pretrain", "depth": d, "seed": s} for d in (2, 4) for s in range(45)]
    rows += [{"kind": "finetune", "task": "semantic_parsing", "depth": 2, "seed": s,
              "init": "final"} for s in range(3)]
    rows += [{"kind": "equal_loss", "task": "semantic_parsing", "depth": 2, "seed": 0}]
    (sweep / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sweep / "wall.json").write_text(json.dumps({"wall_s": 432}))
    (tmp_path / "status.tsv").write_text("sweep45\t124\t432\nstep_cudnn_L32\tskipped\t0\n")

    gpu_report.main([str(tmp_path), "--date", "2026-11-27"])
    out = json.loads((tmp_path / "gpu.json").read_text())
    assert (out["device"], out["jax"], out["date"]) == ("NVIDIA H100 80GB HBM3", "0.11.2",
                                                        "2026-11-27")
    l1, l12 = out["members"]
    assert (l1["layers"], l1["d_ff"], l1["d_ff_padded"]) == (1, 35847, 35968)
    assert l1["step_ms"] == pytest.approx(51.2)
    # 6N: 6 x 134.3M parameters x 640,000 tokens/s over 989 TFLOP/s
    assert l1["mfu_6n"] == pytest.approx(6 * 134_300_000 * 640_000 / 989e12)
    assert (l12["mfu"], l12["peak_gib"], l12["compile_s"]) == (0.245, 3.0, 72.0)
    # 2 depths x 45 seeds x (pretraining + 1 task) + 45 seeds x the control on 1 task
    assert out["sweep45"] == {"wall_s": 432, "seeds": 45, "depths": [2, 4],
                              "tasks": ["semantic_parsing"], "scratch": [4],
                              "units_planned": 225, "units_done": 93, "exit": 124,
                              "device": "NVIDIA H100 80GB HBM3"}
    res = json.loads((tmp_path / "gpu_results.json").read_text())
    assert res["jobs"]["step_cudnn_L32"] == {"exit": "skipped", "seconds": 0}
    assert res["targets"]["cudnn"]["mfu_by_depth"] == {
        "1": {"value": 0.432, "target": 0.40, "met": True},
        "12": {"value": 0.245, "target": 0.40, "met": False}}
