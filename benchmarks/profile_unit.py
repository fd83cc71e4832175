"""Where one unit of the miniature sweep spends its time (issue 37, item 1).

    python benchmarks/profile_unit.py --out profile.json             # both units, seed 0
    python benchmarks/profile_unit.py --units finetune --steps 100   # a shorter look

Trains seed 0 of the miniature plan's units as `depth_sweep` would (its configs, one
process), a 4-layer pretraining and then the 4-layer fine-tuning on semantic parsing from
it, and splits each run's wall time into: data preparation (`Trials.prepare`), restore or
initialisation, the first step (compilation and one step), the other train steps, fetching
batches, evaluation (dev loss and greedy decoding, or validation perplexity), checkpoints, and
the rest (the summary, metrics). Steps are dispatched asynchronously, so every phase that
follows a step first waits for the device (`block_until_ready`), which charges the step's
time to the steps. The steps' achieved FLOP/s are set against the peak the trainer measures
in the same process (a float32 1024^3 matmul on the CPU; trainer/metrics.py). Timers wrap the
trainer's own methods from outside, in this process only.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import arg_parser, environment, write_json  # noqa: E402

from jaxdepth.experiments.depth_sweep import MINIATURE, Sweep  # noqa: E402
from jaxdepth.tasks import train  # noqa: E402
from jaxdepth.trainer import hooks, loop, trials  # noqa: E402

PHASES = ("data", "init", "first_step", "steps", "batches", "evaluation", "checkpoints", "rest")


class Phases:
    """Seconds per phase, accumulated by wrappers around the trainer's methods."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.inside: list[str] = []  # the wrapped calls in progress, outermost first
        self.patches = contextlib.ExitStack()

    def _wrap(self, owner, name: str, phase: str, state_arg: int | None = None):
        real = getattr(owner, name)

        @functools.wraps(real)
        def timed(*args, **kwargs):
            if state_arg is not None:  # charge the steps still in flight to the steps
                jax.block_until_ready(args[state_arg])
            t0 = time.perf_counter()
            self.inside.append(phase)
            try:
                return real(*args, **kwargs)
            finally:
                self.inside.pop()
                self.seconds[phase] += time.perf_counter() - t0
                if phase == "evaluation" and "finish" in self.inside:
                    self.seconds["final_evaluation"] += time.perf_counter() - t0

        self.patches.callback(setattr, owner, name, real)
        setattr(owner, name, timed)

    def _wrap_step(self):
        real = trials.Trials.make_step
        phases = self

        def make_step(self_, *args, **kwargs):
            fn = real(self_, *args, **kwargs)
            first = [True]

            def step(state, batch):
                if not first[0]:
                    return fn(state, batch)
                first[0] = False
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(state, batch))
                phases.seconds["first_step"] += time.perf_counter() - t0
                return out
            return step

        self.patches.callback(setattr, trials.Trials, "make_step", real)
        trials.Trials.make_step = make_step

    def _wrap_batches(self):
        real = trials.Trials.batches
        phases = self

        def batches(self_, *args, **kwargs):
            it = real(self_, *args, **kwargs)
            base = type(it)

            # a subclass made for this one iterator, whose checkpointing it keeps
            class Timed(base):
                def __next__(self):
                    t0 = time.perf_counter()
                    try:
                        return base.__next__(self)
                    finally:
                        phases.seconds["batches"] += time.perf_counter() - t0

            it.__class__ = Timed
            return it

        self.patches.callback(setattr, trials.Trials, "batches", real)
        trials.Trials.batches = batches

    def __enter__(self):
        self._wrap(trials.Trials, "prepare", "data")
        self._wrap(loop, "restore_or_init", "init")
        self._wrap(loop, "_steps", "loop")
        self._wrap(hooks.Evaluations, "__call__", "evaluation", state_arg=2)  # (self, step, state)
        self._wrap(loop, "_finish", "finish")
        self._wrap(hooks.Checkpoints, "save", "checkpoints", state_arg=2)
        self._wrap(hooks.Checkpoints, "wait", "checkpoints")
        self._wrap_step()
        self._wrap_batches()
        return self

    def __exit__(self, *exc):
        self.patches.close()

    def table(self, wall: float) -> dict[str, float]:
        s = self.seconds
        # the loop holds the steps, the batches, the evaluations and saves inside it (but for
        # the final evaluation, which _finish calls after it)
        steps = s["loop"] - s["first_step"] - s["batches"] - s["checkpoints"] - (
            s["evaluation"] - s["final_evaluation"])
        out = {p: s[p] for p in ("data", "init", "first_step", "batches", "evaluation",
                                 "checkpoints")}
        out["steps"] = steps
        out["rest"] = wall - sum(out.values())
        return {p: round(out[p], 3) for p in PHASES}


def profile(cfg, label: str) -> dict:
    with Phases() as phases:
        t0 = time.perf_counter()
        s = train(cfg)
        wall = time.perf_counter() - t0
    table = phases.table(wall)
    steps = cfg.run.steps - 1  # the first is in first_step
    tokens = steps * cfg.data.batch_size * cfg.data.seq_len
    flops_s = tokens * s["flops_per_token"] / table["steps"]
    # the trainer's MFU is its tokens/s x FLOPs per token over the peak it measured
    peak = s["tokens_per_s"] * s["flops_per_token"] / s["mfu"] if s.get("mfu") else None
    return {"unit": label, "wall_s": round(wall, 2), "seconds": table,
            "share": {p: round(v / wall, 3) for p, v in table.items()},
            "steps": cfg.run.steps, "tokens_per_step": cfg.data.batch_size * cfg.data.seq_len,
            "flops_per_token": s["flops_per_token"], "step_flops_per_s": flops_s,
            "peak_flops_per_s": peak, "step_share_of_peak": flops_s / peak if peak else None,
            "trainer_tokens_per_s": s["tokens_per_s"], "trainer_mfu": s.get("mfu")}


def main(argv=None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--units", default="pretrain,finetune")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--steps", type=int, default=0, help="override both units' run.steps")
    p.add_argument("--out", default="profile_unit.json")
    args = p.parse_args(argv)
    units = args.units.split(",")
    with tempfile.TemporaryDirectory() as work:
        sweep = Sweep(Path(work), MINIATURE)
        records = []
        pre = sweep.pretrain_config(args.depth, 0)
        if args.steps:
            pre = _steps(pre, args.steps)
        if "pretrain" in units or "finetune" in units:
            r = profile(pre, f"pretrain L{args.depth}")
            if "pretrain" in units:
                records.append(r)
        if "finetune" in units:
            ft = sweep.finetune_config("semantic_parsing", args.depth, 0, "final", 0)
            if args.steps:
                ft = _steps(ft, args.steps)
            records.append(profile(ft, f"fine-tune L{args.depth} on semantic_parsing"))
    for r in records:
        print(f"{r['unit']}: {r['wall_s']:.1f} s; "
              + ", ".join(f"{p} {r['seconds'][p]:.1f} s ({100 * r['share'][p]:.0f}%)"
                          for p in PHASES)
              + f"; steps at {r['step_flops_per_s'] / 1e9:.1f} GFLOP/s"
              + (f" = {100 * r['step_share_of_peak']:.0f}% of the measured peak"
                 if r["step_share_of_peak"] else ""))
    record = {"benchmark": "profile_unit", **environment(), "units": records}
    write_json(args.out, record)
    return record


def _steps(cfg, steps: int):
    from jaxdepth.config import apply_overrides
    every = min(steps, cfg.run.save_every)
    return apply_overrides(cfg, {"run": {"steps": steps, "save_every": every,
                                         "eval_every": min(steps, cfg.run.eval_every or steps)}})


if __name__ == "__main__":
    main()
