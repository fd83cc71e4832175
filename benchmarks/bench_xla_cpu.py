"""XLA:CPU's options for the train step's matmuls, each measured alone (issue 51's item 1).

XLA flags are process-global and fixed when the backend starts, so every candidate runs in a
process of its own (``--child``): the jaxdepth train step of ``bench_vs_torch.py`` (the 41M
baseline, T=512, B=8, AdamW), ``--warmup`` untimed steps then ``--steps`` timed ones on one
batch. The parent runs the candidates in ``--rounds`` alternating rounds, so that machine noise
hits all of them alike, and reports per candidate the median step over every round, the
spread of the rounds' medians, and whether the losses and the final parameters are bit for
bit the baseline's (a fingerprint per array, trainer/checkpoint.py's).

    python benchmarks/bench_xla_cpu.py --out benchmarks/results/xla_cpu_<machine>.json
    python benchmarks/bench_xla_cpu.py --only baseline,onednn --rounds 2 --steps 2
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Each candidate is XLA_FLAGS, added to what the environment sets. jax 0.10's XLA:CPU runs
# each dot as its own YNNPACK fusion by default (ynn fusion type "individual_dot"); the flags
# naming XNNPACK or oneDNN fusions change nothing in this build (their compiled programs are
# the Eigen path's), so the candidates are YNNPACK's fusion types, Eigen, and the code
# generator's and scheduler's options. "exact" in the report is measured (bit-identical
# parameters after the timed steps), not assumed.
_YNN = "--xla_cpu_experimental_ynn_fusion_type="
CANDIDATES = {
    "baseline": "",
    "eigen_dots": _YNN,
    "eigen_dots_one_thread": _YNN + " --xla_cpu_multi_thread_eigen=false",
    "ynn_dot_fusions": _YNN + "dot",
    "ynn_dots_eltwise": _YNN + "individual_dot,eltwise",
    "ynn_dot_eltwise_reduce": _YNN + "dot,eltwise,reduce",
    "xnn_graph_greedy": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "vector_width_512": "--xla_cpu_prefer_vector_width=512",
    "concurrency_scheduler": "--xla_cpu_enable_concurrency_optimized_scheduler=true",
}


def child(args) -> dict:
    """One candidate's steps in this process (XLA_FLAGS already set by the parent)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import environment, random_lm_batch  # noqa: F401  (tunes malloc first)
    import jax
    from bench_vs_torch import JaxSide, bench_config
    from jaxdepth.config.presets import from_preset
    from jaxdepth.trainer.checkpoint import fingerprints

    model = from_preset(args.preset).model
    cfg = bench_config(model, args.seq_len, args.batch)
    side = JaxSide(cfg, random_lm_batch(cfg))
    t0 = time.perf_counter()
    first = side.step()
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        side.step()
    times, losses = [], [first]
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(side.step())
        times.append(time.perf_counter() - t0)
    jax.block_until_ready(side.state)
    return {"times": times, "losses": losses, "first_step_s": first_s,
            "params": fingerprints(side.state.model), "device_kind": jax.devices()[0].device_kind,
            "jax": jax.__version__}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def main(argv=None) -> dict:
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="41M-L2")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="timed steps per candidate per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated candidates (default: all)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="bench_xla_cpu.json")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    names = [n for n in (args.only.split(",") if args.only else CANDIDATES)]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"--only: unknown candidates {unknown}; known: {', '.join(CANDIDATES)}")
    if "baseline" not in names:
        names.insert(0, "baseline")
    runs = {n: [] for n in names}
    errors = {}
    t_all = time.perf_counter()
    for r in range(args.rounds):
        for n in names:
            if n in errors:
                continue
            env = {**os.environ, "XLA_FLAGS": " ".join(filter(None, [
                os.environ.get("XLA_FLAGS", ""), CANDIDATES[n]]))}
            cmd = [sys.executable, __file__, "--child", n, "--preset", args.preset,
                   "--seq-len", str(args.seq_len), "--batch", str(args.batch),
                   "--warmup", str(args.warmup), "--steps", str(args.steps)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                errors[n] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:500]
                print(f"{n}: failed: {errors[n]}", flush=True)
                continue
            runs[n].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {n}: median "
                  f"{1e3 * statistics.median(runs[n][-1]['times']):.0f} ms", flush=True)
    base = runs["baseline"][0]
    tokens = args.batch * args.seq_len
    results = {}
    for n, rs in runs.items():
        if not rs:
            continue
        every = [t for run in rs for t in run["times"]]
        medians = [statistics.median(run["times"]) for run in rs]
        med = statistics.median(every)
        results[n] = {
            "xla_flags": CANDIDATES[n], "step_s_median": med, "tokens_per_s": tokens / med,
            "round_medians_s": medians, "spread": (max(medians) - min(medians)) / med,
            "first_step_s": [run["first_step_s"] for run in rs],
            "losses": rs[0]["losses"],
            "losses_equal_baseline": all(run["losses"] == base["losses"] for run in rs),
            "params_equal_baseline": all(run["params"] == base["params"] for run in rs),
            "repeatable": all(run["params"] == rs[0]["params"] for run in rs)}
    b = results["baseline"]["step_s_median"]
    print(f"\n{'candidate':24}{'step ms':>9}{'vs base':>9}{'spread':>8}  exact  repeatable")
    for n, r in results.items():
        r["speedup_vs_baseline"] = b / r["step_s_median"]
        print(f"{n:24}{1e3 * r['step_s_median']:>9.0f}{r['speedup_vs_baseline']:>9.3f}"
              f"{100 * r['spread']:>7.1f}%  {str(r['params_equal_baseline']):6} "
              f"{r['repeatable']}")
    out = {"benchmark": "bench_xla_cpu", "cpu": cpu_name(), "cpu_count": os.cpu_count(),
           "preset": args.preset, "seq_len": args.seq_len, "batch": args.batch,
           "warmup": args.warmup, "steps": args.steps, "rounds": args.rounds,
           "environment_xla_flags": os.environ.get("XLA_FLAGS", ""),
           "device_kind": base["device_kind"], "jax": base["jax"], "results": results,
           "errors": errors,
           "wall_s": time.perf_counter() - t_all}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
