"""Train-step benchmark across a parameter-matched depth family (docs/design.md §2 (d), §6, §7).

For every member of a size class (``--family``, Eq. 1 ``d_ff``) this builds the real train
step exactly as ``train.py`` does (``make_mesh``, trainer/state.py's ``start``: AdamW, the
state of one trial on its trial axis, the jitted step) and measures:

- compile time: the tracing + lowering + XLA compile of the step (JAX's own compile-duration
  events, recorded during the first call) and the wall time of that first call;
- step time (mean / median / min over ``--steps`` calls after ``--warmup``, each call
  ``block_until_ready``-ed), tokens/s, analytic train FLOPs/token (PaLM convention,
  ``jaxdepth.models.flops.train_flops_per_token``) and MFU against a stated peak;
- peak memory: on GPU/TPU ``device.memory_stats()['peak_bytes_in_use']``; on CPU the process
  high-water resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), i.e. all host
  memory of the process, Python and JAX included. Both are process-lifetime maxima, so by
  default each member runs in its own subprocess (``--no-isolate`` runs them in one process,
  where the memory column becomes a running maximum).

The peak for MFU is measured in the same run with ``measure_matmul_peak`` (a 1024^3 matmul in
the compute dtype on this device) unless the device is a known accelerator and the compute
dtype is bfloat16, where the datasheet number of ``device_peak_flops`` is used; the JSON records
which. Also reported: compile_time(deepest) / compile_time(shallowest) (target <= 1.3, since
layers run under ``lax.scan``).

    python benchmarks/bench_step.py                       # small family, CPU-sized defaults
    python benchmarks/bench_step.py --family 41M --depths 1,2,7 --seq-len 512 --batch 8
    python benchmarks/bench_step.py --family 374M --seq-len 1024 --batch 32 --dtype bfloat16 \
        --remat dots --steps 20 --out results_374M.json   # on a GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import (CompileEvents, TrainStep, arg_parser, environment, print_table as _print_rows,
                    random_lm_batch, timed, write_json)

import jax
import numpy as np

from jaxdepth.config import (ATTENTIONS, Config, DataConfig, MeshConfig, ModelConfig, OptimConfig,
                             RunConfig)
from jaxdepth.models.depth_family import SIZE_CLASSES, depth_family, param_count
from jaxdepth.models.decoder import padded_d_ff
from jaxdepth.models.flops import train_flops_per_token
from jaxdepth.trainer.metrics import device_peak_flops, measure_matmul_peak


def peak_memory() -> tuple[int, str]:
    """(bytes, what was measured): device peak on accelerators, process max RSS on CPU."""
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        stats = dev.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"]), f"{dev.device_kind} peak_bytes_in_use (device 0)"
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS
    return int(rss_kb * scale), "process max RSS (host, whole process)"


def stated_peak(compute_dtype: str, matmul_n: int = 1024) -> tuple[float, str, float]:
    """(peak FLOP/s per device used for MFU, its source, measured fp32 matmul FLOP/s)."""
    measured_fp32 = measure_matmul_peak(np.float32, n=matmul_n)
    if compute_dtype == "float32":
        return measured_fp32, (f"measured float32 {matmul_n}^3 matmul on "
                               f"{jax.devices()[0].device_kind}"), measured_fp32
    peak, source = device_peak_flops(compute_dtype)  # datasheet on known GPUs/TPUs, else measured
    return peak, source, measured_fp32


def make_config(model: ModelConfig, *, seq_len: int, batch: int, steps: int,
                mesh: MeshConfig | None = None, seed: int = 0) -> Config:
    """The train.py Config for a benchmark: AdamW with the package defaults."""
    return Config(model=model, data=DataConfig(seq_len=seq_len, batch_size=batch),
                  optim=OptimConfig(name="adamw", lr=1e-3), mesh=mesh or MeshConfig(),
                  run=RunConfig(steps=max(steps, 1), seed=seed))


def bench_member(model: ModelConfig, *, seq_len: int, batch: int, steps: int = 10,
                 warmup: int = 2, mesh: MeshConfig | None = None, peak_flops: float | None = None,
                 peak_source: str = "", seed: int = 0) -> dict:
    """Compile and time the real train step of one model; one JSON-able record."""
    cfg = make_config(model, seq_len=seq_len, batch=batch, steps=warmup + steps, mesh=mesh,
                      seed=seed)
    train_step = TrainStep(cfg, random_lm_batch(cfg, seed))  # checks the batch splits
    mesh_ = train_step.mesh
    if peak_flops is None:
        peak_flops, peak_source, _ = stated_peak(model.compute_dtype)
    jax.block_until_ready((train_step.state, train_step.batch))

    with CompileEvents() as ct:
        _, first_call = timed(train_step)
    for _ in range(max(warmup - 1, 0)):
        train_step()
    jax.block_until_ready((train_step.state, train_step.metrics))
    times = [timed(train_step)[1] for _ in range(steps)]
    mem, mem_kind = peak_memory()

    tokens = batch * seq_len
    median = statistics.median(times)
    fpt = train_flops_per_token(model, seq_len)
    tps = tokens / median
    return {
        "n_layers": model.n_layers, "d_model": model.d_model, "d_ff": model.d_ff,
        "d_ff_multiple": model.d_ff_multiple, "d_ff_padded": padded_d_ff(model),
        "n_heads": model.heads, "vocab_size": model.vocab_size, "params": param_count(model),
        "compute_dtype": model.compute_dtype, "remat": model.remat, "attention": model.attention,
        "seq_len": seq_len, "batch": batch, "devices": mesh_.size, "steps": steps, "warmup": warmup,
        "compile_s": ct.seconds(), "compile_breakdown_s": ct.breakdown(),
        "first_call_s": first_call,
        "step_s_mean": statistics.fmean(times), "step_s_median": median, "step_s_min": min(times),
        "step_s_all": times,
        "tokens_per_s": tps, "flops_per_token": fpt,
        "mfu": tps * fpt / (peak_flops * mesh_.size),
        "peak_flops_per_device": peak_flops, "peak_source": peak_source,
        "peak_memory_bytes": mem, "peak_memory_kind": mem_kind,
        "final_loss": train_step.loss(),
    }


def family_members(family: str, depths: str, dtype: str, remat: str,
                   attention: str = "einsum", d_ff_multiple: int = -1) -> list[ModelConfig]:
    fam = depth_family(family)
    want = sorted(fam) if not depths else [int(d) for d in depths.split(",") if d.strip()]
    bad = [d for d in want if d not in fam]
    if bad:
        raise SystemExit(f"--depths: {bad} not in the {family} family; members: {sorted(fam)}")
    return [dataclasses.replace(fam[d], compute_dtype=dtype, remat=remat, attention=attention,
                                d_ff_multiple=d_ff_multiple) for d in want]


def _run_isolated(args, n_layers: int, peak: float, source: str) -> dict:
    """One member in a fresh Python process, so its peak memory is its own."""
    cmd = [sys.executable, os.path.abspath(__file__), "--family", args.family,
           "--depths", str(n_layers), "--seq-len", str(args.seq_len), "--batch", str(args.batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--dtype", args.dtype,
           "--remat", args.remat, "--attention", args.attention,
           "--d-ff-multiple", str(args.d_ff_multiple), "--seed", str(args.seed),
           "--_child", repr(peak), source]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"member n_layers={n_layers} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict]) -> None:
    _print_rows(
        f"{'L':>3} {'d_ff':>6} {'params':>9} {'compile s':>9} {'1st call':>8} {'step ms':>9} "
        f"{'(mean)':>9} {'tok/s':>10} {'GFLOP/tok':>9} {'MFU %':>6} {'peak MiB':>9}",
        (f"{r['n_layers']:>3} {r['d_ff']:>6} {r['params'] / 1e6:>8.2f}M {r['compile_s']:>9.2f} "
         f"{r['first_call_s']:>8.2f} {1e3 * r['step_s_median']:>9.2f} "
         f"{1e3 * r['step_s_mean']:>9.2f} {r['tokens_per_s']:>10,.0f} "
         f"{r['flops_per_token'] / 1e9:>9.4f} {100 * r['mfu']:>6.2f} "
         f"{r['peak_memory_bytes'] / 2**20:>9.0f}" for r in rows))


def latency_table(rows: list[dict]) -> str:
    """Petty et al. Fig. 9 as Markdown: seconds per training step across the family."""
    lines = ["| layers | d_ff | params | s/step (median) | s/step (mean) | relative to shallowest |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = rows[0]["step_s_median"]
    for r in rows:
        lines.append(f"| {r['n_layers']} | {r['d_ff']} | {r['params'] / 1e6:.2f}M | "
                     f"{r['step_s_median']:.4f} | {r['step_s_mean']:.4f} | "
                     f"{r['step_s_median'] / base:.2f} |")
    return "\n".join(lines) + "\n"


def plot_latency(rows: list[dict], path: Path, title: str) -> Path:
    """Fig. 9: seconds per training step against depth (min-max over timed steps as bars)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = [r["n_layers"] for r in rows]
    med = [r["step_s_median"] for r in rows]
    lo = [m - min(r["step_s_all"]) for m, r in zip(med, rows)]
    hi = [max(r["step_s_all"]) - m for m, r in zip(med, rows)]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar(depth, med, yerr=[lo, hi], marker="o", capsize=3)
    ax.set_xlabel("layers (equal parameters)")
    ax.set_ylabel("seconds per training step")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--family", default="small", choices=sorted(SIZE_CLASSES))
    p.add_argument("--depths", default="", help="comma-separated subset of the family's depths")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    p.add_argument("--steps", type=int, default=10, help="timed steps per member")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (the first compiles)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--remat", default="none", choices=["none", "full", "dots"])
    p.add_argument("--attention", default="einsum", choices=ATTENTIONS,
                   help="model.attention: einsum, dot_product (jax.nn.dot_product_attention) or "
                        "cudnn (its fused kernel; GPU, bfloat16)")
    p.add_argument("--d-ff-multiple", type=int, default=-1,
                   help="model.d_ff_multiple: the feed-forward blocks computed with d_ff padded up "
                        "to a multiple of it; -1: 128 on a GPU/TPU, none on the CPU; 1: none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-isolate", action="store_true",
                   help="run every member in this process (memory becomes a running maximum)")
    p.add_argument("--out", default="bench_step.json")
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    members = family_members(args.family, args.depths, args.dtype, args.remat, args.attention,
                             args.d_ff_multiple)
    kw = dict(seq_len=args.seq_len, batch=args.batch, steps=args.steps,
              warmup=max(args.warmup, 1), seed=args.seed)

    if args._child:  # one member, result as the last stdout line
        rec = bench_member(members[0], peak_flops=float(args._child[0]),
                           peak_source=args._child[1], **kw)
        print(json.dumps(rec))
        return rec

    peak, source, fp32 = stated_peak(args.dtype)
    print(f"{args.family} family, seq_len {args.seq_len}, batch {args.batch}, {args.dtype}, "
          f"remat {args.remat}, attention {args.attention}, d_ff_multiple {args.d_ff_multiple}, "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}; "
          f"MFU peak {peak / 1e9:,.1f} GFLOP/s/device ({source})", flush=True)
    rows = []
    for m in members:
        if args.no_isolate:
            rows.append(bench_member(m, peak_flops=peak, peak_source=source, **kw))
        else:
            rows.append(_run_isolated(args, m.n_layers, peak, source))
        print(f"  L={m.n_layers}: {1e3 * rows[-1]['step_s_median']:.1f} ms/step", flush=True)
    print_table(rows)
    shallow, deep = rows[0], rows[-1]
    ratio = deep["compile_s"] / shallow["compile_s"]
    print(f"compile time L={deep['n_layers']} / L={shallow['n_layers']}: {ratio:.2f} (target <= 1.3)")
    # Stacks of <= 2 layers are fully unrolled (DecoderLM's scan_unroll default), so they compile
    # a loop-free program; compare among members that keep the layer loop as well.
    looped = [r for r in rows if r["n_layers"] > 2]
    ratio_looped = (looped[-1]["compile_s"] / looped[0]["compile_s"]) if len(looped) >= 2 else None
    if ratio_looped is not None:
        print(f"compile time L={looped[-1]['n_layers']} / L={looped[0]['n_layers']} "
              f"(shallowest scanned member): {ratio_looped:.2f}")
    out = {
        "benchmark": "bench_step", "family": args.family, "seq_len": args.seq_len,
        "batch": args.batch, "compute_dtype": args.dtype, "remat": args.remat,
        "attention": args.attention, "d_ff_multiple": args.d_ff_multiple,
        "isolated_processes": not args.no_isolate, **environment(),
        "peak_flops_per_device": peak, "peak_source": source, "measured_fp32_matmul_flops": fp32,
        "flops_convention": "train_flops_per_token: 6*N_matmul + 12*L*T*d_model (PaLM App. B)",
        "memory_convention": shallow["peak_memory_kind"],
        "compile_ratio_deepest_over_shallowest": ratio,
        "compile_ratio_deepest_over_shallowest_scanned": ratio_looped,
        "members": rows,
    }
    write_json(args.out, out)
    stem = Path(args.out).with_suffix("")
    Path(f"{stem}_latency.md").write_text(latency_table(rows))
    plot_latency(rows, Path(f"{stem}_latency.png"),
                 f"{args.family} family, T={args.seq_len}, B={args.batch}, {args.dtype}, "
                 f"{jax.devices()[0].device_kind}")
    print(f"wrote {args.out}, {stem}_latency.md and {stem}_latency.png (Fig. 9)")
    return out


if __name__ == "__main__":
    main()
