"""Trials against solo runs: the step time of K runs trained side by side (trainer/trials.py).

For each model (``--models``: tiny = the ``tiny-L2`` preset, the tiny depth family's baseline
member; tiny4 = ``tiny-L4``, the miniature sweep's deepest member; small = ``small-L4``, the
default model; act = ``act-cpu``, the ACT encoder of docs/act.md, whose n_layers is its
iteration bound M) and each K (``--ks``), the script builds the
config train.py builds from ``--preset NAME --run.seeds 0,...,K-1`` (``cli.parse_args``; the
lm recipe's optimizer, data.seq_len 128 and data.batch_size 32 unless ``--seq-len`` /
``--batch`` say otherwise) and the K-trial step exactly as the training loop does
(``trial_configs``, one ``task_for`` per trial, trainer/state.py's ``start`` and
``batch_sharding``), and, once per model, the solo step of trial 0's config (the same, a run
of one trial).

Batches: with ``--data grammar`` (the default) they are the real ones, drawn from the
embedded grammar corpus prepared once in a temporary folder (``--grammar-docs`` documents,
the default run's 20,000 unless told) through each trial's own data iterator
(``Batches`` over ``lm_iterator(task.dataset())``, so each trial sees its own seed's
order); ``--data random`` synthesises token batches of the same shape instead (the step time
does not depend on the token values). ``--batches`` (4) of them are placed on the device
before timing and used in turn, so the data pipeline is not timed.

Timing is steady state: each step is called once to compile (its compile time and first
call are recorded), ``--warmup`` more untimed calls follow, then ``--steps`` rounds each call
the K-trial step and the solo step once (``common.interleaved_times``: alternating order,
every call blocked until ready), so machine drift hits both alike. Per K the JSON reports the
medians ``trial_step_ms`` and ``solo_step_ms`` (the solo step measured in the same rounds),
``ratio`` = trial_step / solo_step, ``speedup`` = K * solo_step / trial_step (above 1: K trials
side by side beat K solo runs one after another), ``trials_per_s`` = K / trial_step, tokens/s
and achieved FLOP/s (the model's ``flops_per_token`` for its task's step, as the loop counts;
the measured fp32 1024^3 matmul rate is recorded beside it for scale). The issue's target, "K = 8 tiny-model trials cost <= 3x one
trial's step time", is ``target_k8_tiny_le_3x`` (with its ratio), null when tiny or K=8 was
not run. A run of one trial (K = 1, the solo step) calls the trial's update on the trial
itself, where K > 1 vmaps it (trial_axis.over_trials).

Memory: each step is checked on its first call as the training loop checks it
(trainer/memory.py's ``step_check``); a K whose step cannot fit is listed under ``skipped``
with the reason instead of being run, and XLA's estimate of what each step adds
(``step_new_bytes``) is recorded. The buffers of one K are released before the next, and the
JSON is rewritten after every K (``complete``: false until the end), so a run killed part way
keeps what it measured.

Evaluation (``--parts eval``): one evaluation point of K (``--eval-ks``) fresh tiny-L2 trials,
``Task.evaluate`` over the stacked models against each trial's on its slice (the two
``trials.evaluation`` settings), interleaved, for prefix-LM fine-tuning on the grammar's
passivization (dev loss and greedy exact match of ``--eval-examples`` per split) and LM
validation perplexity; with the first (compiling) call's time and whether both give the same
accuracies (and how far apart the losses are).

Experiments (``--parts``; by default all three parts, the grid only with ``--ner-dir``): each
runs one experiment command twice in fresh processes, ``--sequential`` (one program per unit,
as before trials) and then with trials (the default), and reports both wall times, ``speedup``
= sequential / trials and ``drift``: the units only one way has, how many shared units differ,
and each result field's largest absolute difference (common.py's ``two_ways`` and ``drift``).

- ``grid``: the FE half of the miniature few-shot grid, ``fusion_fewshot all --preset
  miniature --modes fe --ner-dir DIR`` on one pretrained backbone (``--backbone``, or the
  experiment's miniature pretraining once, untimed); target: trials >= 5x faster.
- ``slice``: a 4-seed, depth-2 passivization slice of the miniature depth sweep,
  ``depth_sweep run --preset miniature --depths 2 --seeds 0,1,2,3 --tasks passivization
  --scratch none`` (pretraining and fine-tuning; results: validation perplexity and loss,
  dev loss, in-distribution and generalization accuracy).

``--grid-extra`` / ``--slice-extra`` append arguments to either command (a smaller plan for a
smoke run); ``--workdir`` keeps the experiment directories.

    python benchmarks/bench_trials.py --ner-dir data/wikiann/en    # all three parts
    python benchmarks/bench_trials.py --parts slice                # the sweep slice only
    python benchmarks/bench_trials.py --parts steps            # tiny and small, K=1..16
    python benchmarks/bench_trials.py --parts steps --models tiny --ks 1,8 --steps 20
    python benchmarks/bench_trials.py --quick --out q.json     # CI scale: seconds
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import (CompileEvents, arg_parser, drift, environment, fewshot_backbone,
                    fewshot_grid_command, fewshot_units, interleaved_times, print_table,
                    random_lm_batch, timed, two_ways, write_json)

import equinox as eqx
import jax
import numpy as np

from jaxdepth.config.cli import parse_args
from jaxdepth.config import Config
from jaxdepth.config.trials import trial_configs
from jaxdepth.data.corpus.pipeline import lm_iterator
from jaxdepth.tasks import task_for
from jaxdepth.trainer.trials import Batches
from jaxdepth.trainer.metrics import measure_matmul_peak
from jaxdepth.trainer.memory import DoesNotFit, step_check, xla_estimate
from jaxdepth.trainer import sharding as shd
from jaxdepth.trainer.sharding import batch_sharding, make_mesh
from jaxdepth.trainer.state import start

# name -> preset
MODELS = {"tiny": "tiny-L2", "tiny4": "tiny-L4", "small": "small-L4", "act": "act-cpu"}
TARGET_K, TARGET_MODEL, TARGET_RATIO = 8, "tiny", 3.0  # K=8 tiny trials <= 3x one trial's step


def train_args(preset: str, k: int, args) -> list[str]:
    """train.py's command line for K trials of the preset at the benchmark's shape."""
    out = ["--preset", preset, "--run.seeds", ",".join(str(s) for s in range(k)),
           "--run.steps", str(max(args.steps + args.warmup + 1, 10)),
           "--data.grammar_docs", str(args.grammar_docs), "--mesh.data", str(args.mesh_data)]
    if args.seq_len:
        out += ["--data.seq_len", str(args.seq_len)]
    if args.batch:
        out += ["--data.batch_size", str(args.batch)]
    return out


def memory_check(cfg: Config, mesh, record: dict):
    """The training loop's on_compile (trainer/memory.py: refuse, with DoesNotFit, a step that
    cannot fit the device or the process's memory), also recording XLA's estimate of the bytes
    the step adds (temporaries + outputs - donated) in record["step_new_bytes"]."""
    check = step_check(cfg, mesh)
    sharing = 1 if mesh.devices.flat[0].platform != "cpu" else mesh.size

    def on_compile(compiled, state, batch):
        est = xla_estimate(compiled, sharing)
        record["step_new_bytes"] = None if est is None else est.new
        if check is not None:
            check(compiled, state, batch)

    return on_compile


def release_memory() -> None:
    """Hand the heap freed by the previous K's buffers back to the OS (glibc's malloc_trim:
    common.py's tune_malloc keeps freed heap otherwise), so that the largest K's step does not
    stack on the high-water mark of the ones before it."""
    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


class Stepper:
    """A jitted step, its state and a few device batches used in turn; calling it takes one
    step and returns (state, metrics), not waited for."""

    def __init__(self, step_fn, state, batches: list[dict]):
        self.step_fn, self.state, self.batches = step_fn, state, batches
        self.i, self.metrics = 0, None

    def __call__(self):
        batch = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.state, self.metrics = self.step_fn(self.state, batch)
        return self.state, self.metrics

    def compile_and_warm(self, warmup: int) -> tuple[dict, float, float]:
        """(compile seconds: trace, lower, XLA compile, first call's wall seconds, the first
        step's loss of trial 0); then `warmup` more untimed calls."""
        with CompileEvents() as ct:
            _, first = timed(self)
        loss = float(np.asarray(self.metrics["loss"]).reshape(-1)[0])
        for _ in range(warmup):
            self()
        jax.block_until_ready((self.state, self.metrics))
        return ct.breakdown(), first, loss


def host_batches(cfgs: list[Config], tasks: list, n: int, data: str,
                 data_dir: Path | None) -> list[dict]:
    """n batches of numpy arrays, stacked over the trials ([K, B, ...])."""
    if data == "random":
        rows = [[random_lm_batch(c, seed=1000 * i + c.run.seed) for c in cfgs] for i in range(n)]
        return [{k: np.stack([b[k] for b in r]) for k in r[0]} for r in rows]
    for t in tasks:  # every trial of a seed-only grid shares the run directory's data
        t.prepare(data_dir, True, barrier=lambda: None)
    its = [lm_iterator(t.dataset(), prefetch=0) for t in tasks]
    it = Batches(its)
    try:
        return [next(it) for _ in range(n)]
    finally:
        for i in its:
            if hasattr(i, "close"):
                i.close()


def stepper(cfgs: list[Config], mesh, args, data_dir, record: dict) -> Stepper:
    """The step of the K trials of cfgs (K = 1: the solo run), as the training loop builds
    it (trainer/state.py)."""
    tasks = [task_for(c) for c in cfgs]
    state, step_fn, _ = start(cfgs, tasks, mesh,
                              on_compile=memory_check(cfgs[0], mesh, record))
    b_sh = batch_sharding(mesh, len(cfgs))
    batches = [{k: jax.device_put(v, b_sh) for k, v in b.items()}
               for b in host_batches(cfgs, tasks, args.batches, args.data, data_dir)]
    return Stepper(step_fn, state, batches)


def bench_model(name: str, args, data_dir: Path | None, report) -> dict:
    """The record of one model: the solo step, then each K against it. report(record) is
    called after each K with the record so far (the JSON is rewritten as results come)."""
    preset = MODELS[name]
    base = parse_args(train_args(preset, 1, args))
    solo_cfg = trial_configs(base)[0]  # the solo run of seed 0 that trial 0 equals
    mesh = make_mesh(solo_cfg.mesh)
    B, T = solo_cfg.data.batch_size, solo_cfg.data.seq_len
    # FLOPs as the loop counts them: the model's for this task's step (its shape suffices)
    task = task_for(solo_cfg)
    shape = eqx.filter_eval_shape(task.build_model, key=jax.random.key(0))
    fpt = shape.flops_per_token(T, **task.step_flops)
    solo_mem: dict = {}
    solo = stepper([solo_cfg], mesh, args, data_dir, solo_mem)
    solo_compile, solo_first, solo_loss = solo.compile_and_warm(args.warmup)
    print(f"{name} ({preset}, T={T}, B={B}): solo step compiled in "
          f"{sum(solo_compile.values()):.2f} s", flush=True)
    layers, d_model, d_ff = solo_cfg.model_spec.dims()[:3]
    rec = {"model": name, "preset": preset, "n_layers": layers, "d_model": d_model, "d_ff": d_ff,
           "vocab_size": solo_cfg.vocab_size, "seq_len": T, "batch": B,
           "optimizer": solo_cfg.optim.name, "devices": mesh.size, "flops_per_token": fpt,
           "solo_compile_s": sum(solo_compile.values()), "solo_compile_breakdown_s": solo_compile,
           "solo_first_call_s": solo_first, "solo_step_new_bytes": solo_mem.get("step_new_bytes"),
           "train_py_args_k8": train_args(preset, 8, args), "ks": [], "skipped": []}
    for k in args.ks:
        cfgs = trial_configs(parse_args(train_args(preset, k, args)))
        assert len(cfgs) == k and [c.run.seed for c in cfgs] == list(range(k))
        mem: dict = {}
        trial = stepper(cfgs, mesh, args, data_dir, mem)
        try:
            t_compile, t_first, t_loss = trial.compile_and_warm(args.warmup)
        except DoesNotFit as e:  # the loop would refuse this K too: say so, go on
            rec["skipped"].append({"k": k, "reason": str(e), "step_new_bytes":
                                   mem.get("step_new_bytes")})
            print(f"  K={k:>2}: skipped, does not fit: {str(e).splitlines()[0]}", flush=True)
            trial = None  # free its states before the next K
            release_memory()
            report(rec)
            continue
        times = interleaved_times({"trial": trial, "solo": solo}, args.steps)
        trial_s, solo_s = statistics.median(times["trial"]), statistics.median(times["solo"])
        losses = np.asarray(trial.metrics["loss"])
        row = {
            "k": k, "trial_step_ms": 1e3 * trial_s, "solo_step_ms": 1e3 * solo_s,
            "ratio": trial_s / solo_s, "speedup": k * solo_s / trial_s,
            "trials_per_s": k / trial_s, "solo_steps_per_s": 1 / solo_s,
            "trial_step_ms_min": 1e3 * min(times["trial"]),
            "solo_step_ms_min": 1e3 * min(times["solo"]),
            "trial_step_ms_all": [1e3 * t for t in times["trial"]],
            "solo_step_ms_all": [1e3 * t for t in times["solo"]],
            "tokens_per_s": k * B * T / trial_s, "solo_tokens_per_s": B * T / solo_s,
            "achieved_flops_per_s": fpt * k * B * T / trial_s,
            "solo_achieved_flops_per_s": fpt * B * T / solo_s,
            "compile_s": sum(t_compile.values()), "compile_breakdown_s": t_compile,
            "first_call_s": t_first,
            "step_new_bytes": mem.get("step_new_bytes"),  # XLA: temporaries + outputs - donated
            # trial 0 is the solo run of seed 0: same weights, same first batch, same loss
            "first_loss_trial0": t_loss, "first_loss_solo": solo_loss,
            "final_losses_finite": bool(np.all(np.isfinite(losses))),
            "frozen": int(np.sum(np.asarray(trial.state.frozen))),
        }
        rec["ks"].append(row)
        print(f"  K={k:>2}: trial {row['trial_step_ms']:8.1f} ms, solo {row['solo_step_ms']:7.1f} "
              f"ms, ratio {row['ratio']:5.2f}, speedup {row['speedup']:4.2f}x "
              f"(compile {row['compile_s']:.1f} s)", flush=True)
        trial = None  # free the K states (and their step's buffers) before the next K
        release_memory()
        report(rec)
    return rec


GRID_TARGET = 5.0  # the FE grid: sequential wall / trials wall >= this
PARTS = ("steps", "eval", "grid", "slice")
EVAL_KINDS = ("prefix_lm", "lm")


def eval_tasks(kind: str, k: int, work: Path, tokenizer: Path, n_eval: int) -> list:
    """K prepared tasks of tiny-L2 trials of `kind` (seeds 0..K-1), each in its own directory:
    prefix-LM fine-tuning on the grammar's passivization (n_eval examples of dev and both
    generalization splits scored) or LM pretraining on the grammar (its validation batches)."""
    args = ["--preset", "tiny-L2", "--run.dir", str(work), "--data.tokenizer", str(tokenizer),
            "--run.seeds", ",".join(map(str, range(k))), "--trials.evaluation", "vmapped"]
    if kind == "prefix_lm":
        args += ["--task.name", "passivization", "--task.n_train", "64", "--task.n_eval",
                 str(n_eval), "--task.eval_max", str(n_eval), "--data.seq_len", "96",
                 "--task.truncate", "true"]
    else:  # the LM's validation set: documents of the grammar corpus
        args += ["--data.grammar_docs", "20000"]
    tasks = [task_for(c) for c in trial_configs(parse_args(args))]
    for i, t in enumerate(tasks):
        t.prepare(work / f"trial{i}", True, lambda: None)
    return tasks


def bench_eval(kind: str, k: int, work: Path, tokenizer: Path, args) -> dict:
    """One evaluation point of K fresh trials (random weights, as at step 0), vmapped
    (Task.evaluate, one program over the stacked models) against trial by trial (each
    trial's evaluate on its slice, the solo programs), interleaved; and whether both give the
    same numbers."""
    import equinox as eqx

    from jaxdepth.models.trial_axis import Models

    tasks = eval_tasks(kind, k, work / kind, tokenizer, args.eval_examples)
    models = [tasks[0].build_model(key=jax.random.key(i)) for i in range(k)]
    stacked = jax.tree.map(lambda *xs: jax.numpy.stack(xs) if eqx.is_array(xs[0]) else xs[0],
                           *models)
    assert tasks[0].evaluates_alike(tasks), "the trials do not evaluate alike"
    # as the training loop evaluates
    sh = shd.batch_sharding(make_mesh(tasks[0].cfg.mesh))
    stacked = Models(stacked, k)
    calls = {"vmapped": lambda: tasks[0].evaluate(stacked, tasks, 0, sh, False),
             "trial_by_trial": lambda: [t.evaluate(stacked.pick(i), [t], 0, sh, False)[0]
                                        for i, t in enumerate(tasks)]}
    first = {n: timed(c)[1] for n, c in calls.items()}  # compiles
    results = {n: c() for n, c in calls.items()}
    times = interleaved_times(calls, args.eval_repeats)
    keys = ("id_accuracy", "gen_accuracy", "lexical", "structural")
    same = (all(results["vmapped"][i][0].get(n) == results["trial_by_trial"][i][0].get(n)
                for i in range(k) for n in keys) if kind == "prefix_lm" else None)
    loss = "dev_loss" if kind == "prefix_lm" else "valid_loss"
    rel = max(abs(a[0][loss] - b[0][loss]) / abs(b[0][loss])
              for a, b in zip(results["vmapped"], results["trial_by_trial"]))
    med = {n: statistics.median(t) for n, t in times.items()}
    rec = {"kind": kind, "k": k, "first_call_s": first, "eval_s": med,
           "eval_s_all": times, "speedup": med["trial_by_trial"] / med["vmapped"],
           "same_accuracies": bool(same), "largest_rel_loss_difference": rel}
    print(f"eval {kind}, K={k}: vmapped {med['vmapped']:.3f} s, trial by trial "
          f"{med['trial_by_trial']:.3f} s ({rec['speedup']:.2f}x); same accuracies: {same}, "
          f"loss apart by {rel:.1e}", flush=True)
    return rec


def evaluations(args, work: Path, report) -> list[dict]:
    """The eval part: each kind at each K of --eval-ks."""
    from jaxdepth.data.embedded.grammar import corpus_texts
    from jaxdepth.data.corpus.tokenizer import train_tokenizer

    if "eval" not in args.parts:
        return []
    tok = work / "eval_tokenizer.model"
    work.mkdir(parents=True, exist_ok=True)
    train_tokenizer(corpus_texts(3000, seed=0), 512).save(tok)
    out = []
    for kind in EVAL_KINDS:
        for k in args.eval_ks:
            out.append(bench_eval(kind, k, work / f"eval_k{k}", tok, args))
            report(out)
    return out
WAYS = {"sequential": ["--sequential"], "trials": []}


def sweep_units(out: Path) -> dict:
    """{"pretrain L<d> s<seed>": {valid_ppl, valid_loss}, "finetune <task> L<d> s<seed>
    <init>": {dev_loss, id_accuracy, gen_accuracy, lexical, structural}} of a sweep directory."""
    from jaxdepth.analysis.results import load_rows

    units = {}
    for r in load_rows(out):
        if r["kind"] == "pretrain":
            units[f"pretrain L{r['depth']} s{r['seed']}"] = {
                k: r[k] for k in ("valid_ppl", "valid_loss")}
        elif r["kind"] == "finetune":
            units[f"finetune {r['task']} L{r['depth']} s{r['seed']} {r['init']}"] = {
                k: r.get(k) for k in ("dev_loss", "id_accuracy", "gen_accuracy", "lexical",
                                      "structural")}
    return units


def experiment(name: str, base: list[str], work: Path, units, target: float | None) -> dict:
    """One experiment command both ways (sequential first), compared."""
    print(f"{name}: {' '.join(base[1:])}", flush=True)
    runs = two_ways(base, WAYS, work / name, units)
    speedup = runs["sequential"]["wall_s"] / runs["trials"]["wall_s"]
    d = drift(runs["sequential"]["results"], runs["trials"]["results"])
    print(f"{name}: sequential {runs['sequential']['wall_s']:.1f} s, trials "
          f"{runs['trials']['wall_s']:.1f} s: {speedup:.2f}x; {d['units_that_differ']} of "
          f"{d['units_compared']} units differ, largest differences "
          f"{d['largest_abs_difference']}", flush=True)
    return {"command": " ".join(base[1:]), "order": "sequential first, then trials", **runs,
            "speedup": speedup, "drift": d,
            **({} if target is None else {"target_speedup": target,
                                          "within_target": bool(speedup >= target)})}


def experiments(args, work: Path, report) -> dict:
    """The grid and slice parts asked for; report(out) after each, so a part that fails later
    does not lose one that finished."""
    out = {}
    if "grid" in args.parts:
        base = fewshot_grid_command(args.ner_dir, args.grid_extra)
        backbone = args.backbone or fewshot_backbone(base, work / "grid")
        out["grid"] = experiment("grid", base + ["--backbone", backbone], work,
                                 lambda d: fewshot_units(d), GRID_TARGET)
        out["grid"]["backbone"] = backbone
        report(out)
    if "slice" in args.parts:
        base = [sys.executable, "-m", "jaxdepth.experiments.depth_sweep", "run", "--preset",
                "miniature", "--depths", "2", "--seeds", "0,1,2,3", "--tasks", "passivization",
                "--scratch", "none", *shlex.split(args.slice_extra)]
        out["slice"] = experiment("slice", base, work, sweep_units, None)
        report(out)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--ks", default=None, help="numbers of trials K (default 1,2,4,8,16; "
                   "--quick: 1,2)")
    p.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)} "
                   "(default tiny,small; --quick: tiny)")
    p.add_argument("--steps", type=int, default=None, help="timed rounds (default 10; --quick: 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls after the compiling one")
    p.add_argument("--batches", type=int, default=4, help="distinct device batches used in turn")
    p.add_argument("--seq-len", type=int, default=0, help="data.seq_len (0: the config's, 128; "
                   "--quick: 32)")
    p.add_argument("--batch", type=int, default=0, help="data.batch_size (0: the config's, 32; "
                   "--quick: 8)")
    p.add_argument("--data", choices=("grammar", "random"), default="grammar",
                   help="real batches of the embedded grammar corpus, or random tokens")
    p.add_argument("--grammar-docs", type=int, default=None,
                   help="data.grammar_docs of the prepared corpus (default 20000; --quick: 300)")
    p.add_argument("--mesh-data", type=int, default=-1,
                   help="mesh.data (-1: every device, as train.py)")
    p.add_argument("--quick", action="store_true", help="CI-scale smoke run of the step part "
                   "(seconds)")
    p.add_argument("--parts", default=None, help=f"comma-separated, of {', '.join(PARTS)} "
                   "(default: all three with --ner-dir, else steps,slice; --quick: steps)")
    p.add_argument("--eval-ks", default="5", help="numbers of trials K of the eval part")
    p.add_argument("--eval-examples", type=int, default=100,
                   help="examples scored per split in the eval part's prefix-LM evaluation")
    p.add_argument("--eval-repeats", type=int, default=5, help="timed rounds of the eval part")
    p.add_argument("--ner-dir", default="", help="WikiAnn or CoNLL-2003 directory (the grid part)")
    p.add_argument("--backbone", default="", help="a pretrained run or HF directory for the grid "
                   "part; empty: the experiment's miniature pretraining, once, untimed")
    p.add_argument("--grid-extra", default="", help="more fusion_fewshot arguments (grid part)")
    p.add_argument("--slice-extra", default="", help="more depth_sweep arguments (slice part)")
    p.add_argument("--workdir", default="", help="where the experiments run (kept); default: a "
                   "temporary directory")
    p.add_argument("--out", default="bench_trials.json")
    args = p.parse_args(argv)
    q = args.quick
    default = "steps" if q else ("steps,grid,slice" if args.ner_dir else "steps,slice")
    args.parts = [x.strip() for x in (args.parts or default).split(",") if x.strip()]
    if not args.parts or set(args.parts) - set(PARTS):
        raise SystemExit(f"--parts: {','.join(args.parts) or 'none'}; known: {', '.join(PARTS)}")
    if "grid" in args.parts and not args.ner_dir:
        raise SystemExit("the grid part needs --ner-dir (a WikiAnn or CoNLL-2003 directory); "
                         "--parts steps,slice leaves it out")
    args.ks = [int(k) for k in (args.ks or ("1,2" if q else "1,2,4,8,16")).split(",") if k.strip()]
    args.eval_ks = [int(k) for k in args.eval_ks.split(",") if k.strip()]
    args.models = [m.strip() for m in (args.models or ("tiny" if q else "tiny,small")).split(",")
                   if m.strip()]
    args.steps = args.steps if args.steps is not None else (3 if q else 10)
    args.grammar_docs = args.grammar_docs if args.grammar_docs is not None else (300 if q else 20000)
    if q:
        args.seq_len, args.batch = args.seq_len or 32, args.batch or 8
        args.warmup = min(args.warmup, 1)
    bad = [m for m in args.models if m not in MODELS]
    if bad or not args.models:
        raise SystemExit(f"--models: {bad or 'none'}; known: {', '.join(MODELS)}")
    if not args.ks or min(args.ks) < 1 or args.steps < 1 or args.batches < 1 or args.warmup < 0:
        raise SystemExit("--ks, --steps and --batches must be >= 1, --warmup >= 0")

    t0 = time.perf_counter()
    matmul = None  # the step part's scale for achieved FLOP/s
    if "steps" in args.parts:
        matmul = measure_matmul_peak(np.float32, n=256 if q else 1024)
        print(f"{jax.device_count()} x {jax.devices()[0].device_kind}; fp32 matmul "
              f"{matmul / 1e9:,.1f} GFLOP/s; data: {args.data}", flush=True)
    head = {
        "benchmark": "bench_trials", **environment(),
        "data": ("grammar: real batches of the embedded grammar corpus, each trial's own "
                 "iterator (Batches)" if args.data == "grammar" else
                 "random: synthesised token batches of the step's shape"),
        "grammar_docs": args.grammar_docs if args.data == "grammar" else None,
        "ks_requested": args.ks, "steps": args.steps, "warmup": args.warmup,
        "batches": args.batches, "quick": q, "parts": args.parts,
        "timing": ("median over --steps interleaved rounds, each calling the K-trial step and "
                   "the solo step once (blocked until ready), after one compiling call and "
                   "--warmup untimed calls; solo_step_ms is measured in the same rounds"),
        "measured_fp32_matmul_flops": matmul,
    }
    models: list[dict] = []

    def report(rec: dict) -> None:  # partial results survive a crash (an OOM kill at K=16)
        write_json(args.out, {**head, "complete": False, "models": models + [rec],
                              "wall_s": time.perf_counter() - t0})

    with tempfile.TemporaryDirectory(prefix="bench_trials_") as tmp:
        data_dir = Path(tmp) if args.data == "grammar" else None
        for m in args.models if "steps" in args.parts else []:
            models.append(bench_model(m, args, data_dir, report))
        work = Path(args.workdir) if args.workdir else Path(tmp) / "experiments"
        evals = evaluations(args, work, lambda done: write_json(args.out, {
            **head, "complete": False, "models": models, "eval": done,
            "wall_s": time.perf_counter() - t0}))
        exps = experiments(args, work, lambda done: write_json(args.out, {
            **head, "complete": False, "models": models, "eval": evals, **done,
            "wall_s": time.perf_counter() - t0}))

    target = None
    tiny = next((m for m in models if m["model"] == TARGET_MODEL), None)
    row8 = next((r for r in (tiny or {"ks": []})["ks"] if r["k"] == TARGET_K), None)
    if row8 is not None:
        k1 = next((r for r in tiny["ks"] if r["k"] == 1), None)
        target = {"met": bool(row8["ratio"] <= TARGET_RATIO), "ratio": row8["ratio"],
                  "limit": TARGET_RATIO, "ratio_vs_k1_trial_step":
                  row8["trial_step_ms"] / k1["trial_step_ms"] if k1 else None}
    print()
    if models:
        print_table("model  preset    T    B   K | trial ms |  solo ms | trial/solo | speedup | trials/s",
                    [f"{m['model']:<6} {m['preset']:<8} {m['seq_len']:>3} {m['batch']:>4} "
                     f"{r['k']:>3} | {r['trial_step_ms']:8.1f} | {r['solo_step_ms']:8.1f} | "
                     f"{r['ratio']:10.2f} | {r['speedup']:7.2f} | {r['trials_per_s']:8.2f}"
                     for m in models for r in m["ks"]])
    out = {
        **head, "complete": True,
        "target": f"K={TARGET_K} {TARGET_MODEL} trials: trial_step <= {TARGET_RATIO} x solo_step",
        "target_k8_tiny_le_3x": target["met"] if target else None,
        "target_k8_tiny_ratio": target["ratio"] if target else None,
        "target_k8_tiny_ratio_vs_k1_trial_step": target["ratio_vs_k1_trial_step"] if target else None,
        "models": models, "eval": evals, **exps,
    }
    out["wall_s"] = time.perf_counter() - t0
    if target:
        print(f"\ntarget K={TARGET_K} tiny trials <= {TARGET_RATIO}x solo step: ratio "
              f"{target['ratio']:.2f}: {'met' if target['met'] else 'MISSED'}")
    write_json(args.out, out)
    print(f"wrote {args.out} ({out['wall_s']:.0f} s)")
    return out


if __name__ == "__main__":
    main()
