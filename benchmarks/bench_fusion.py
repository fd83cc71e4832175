"""Train-step cost of layer fusion: FE and FT with Base, Base+n, Concat and DWAtt (docs/design.md §4).

Every configuration is the NER fusion job's real train step, built as ``train.py`` builds it
(``make_optimizer`` AdamW, ``make_mesh``, trainer/state.py's ``state_shardings``,
``init_one`` and ``make_step`` with the NER task's objective, one trial on its trial axis), on
one backbone: a fresh ``model.arch=encoder``
of the given shape (every configuration is initialised from the same seed, so the backbone
weights are identical; the JSON records that this was checked), or a Hugging Face BERT/RoBERTa
directory (``--hf``, loaded with the NER task's ``initial_model``). The batch is synthetic and
fixed: random tokens, full rows, ``--labelled`` positions per row in a first-sub-token layout
(every other position after [CLS]) and random WikiAnn labels.

Also timed: the backbone's own backward pass, ``t(value_and_grad) - t(forward)`` of the scalar
``mean(h_L ** 2)`` of its last-layer output w.r.t. every backbone array (both jitted, no
dropout). Every function is compiled once (the first, untimed call), then all of them are timed
in ``--repeats`` interleaved rounds (rotating order, so machine drift is shared) and the median
is reported.

Checks of the issue:

- ``dwatt_fe_over_base_fe`` = t(FE dwatt) / t(FE base), target <= 1.10: DWAtt runs on the P
  gathered positions only, so it should add little to a step whose cost is the backbone forward;
- per method, ``ft_minus_fe`` = t(FT m) - t(FE m) >= ``backbone_backward_s``: FE must really
  skip the backbone's backward (and its optimizer update), so the difference should be at
  least the backbone's backward (``ft_minus_fe_over_backbone_backward`` >= 1).

The steps above are the uncached ones (``fusion.cache=false``: FE reruns the frozen backbone
every step). ``--unit`` instead times one few-shot FE unit end to end, as ``train.py`` runs it
(data, tokenizer, compilation, steps, evaluations), with the backbone states cached
(``fusion.cache``, tasks/state_cache.py) and without, and checks that both give the same F1 at
every evaluation (target: cached >= 5x faster). ``--grid`` times the FE half of the miniature
few-shot experiment (``fusion_fewshot all --preset miniature --modes fe``, 40 units in one
process each way) cached and uncached on one pretrained backbone, and checks that every
unit's results agree (target: cached >= 3x faster). ``models/all-MiniLM-L6-v2`` below is what
``python -m jaxdepth.data.download all-MiniLM-L6-v2 --cache models`` makes.

    python benchmarks/bench_fusion.py                     # d 256, 4 layers, T 64, B 16, P 16
    python benchmarks/bench_fusion.py --hf /path/to/bert-base-cased --seq-len 128 --batch 8
    python benchmarks/bench_fusion.py --unit --ner-dir data/wikiann/en --hf models/all-MiniLM-L6-v2
    python benchmarks/bench_fusion.py --grid --ner-dir data/wikiann/en   # pretrains its backbone
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import (arg_parser, drift, environment, fewshot_backbone, fewshot_grid_command,
                    fewshot_units, interleaved_times, last_list, print_table as _print_rows,
                    timed, two_ways, write_json)

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.config import Config, ConfigError, apply_overrides
from jaxdepth.data.finetune.ner_sentences import ner_labels
from jaxdepth.config import FUSION_MODES
from jaxdepth.models.backbone import depth_and_width
from jaxdepth.models.fusions import fusion_methods, own_settings
from jaxdepth.tasks import task_for, train
from jaxdepth.optim import make_optimizer
from jaxdepth.trainer.sharding import batch_sharding, make_mesh
from jaxdepth.trainer.state import init_one, make_step, state_shardings
from jaxdepth.models.trial_axis import stack

# Every registered method and mode (a new fusion method is timed without editing this file).
METHODS = fusion_methods()
MODES = tuple(FUSION_MODES)
DWATT_TARGET = 1.10  # t(FE dwatt) / t(FE base) <= this
UNIT_TARGET = 5.0  # t(uncached FE unit) / t(cached FE unit) >= this
GRID_TARGET = 3.0  # t(uncached FE grid) / t(cached FE grid) >= this
CACHE_ORDER = (True, False)
BACKBONE_PATHS = ("backbone_forward", "backbone_value_and_grad")

# A tiny WikiAnn-format train file: only its format (-> the label set) is read by the model.
WIKIANN_SAMPLE = ("en:John\tB-PER\nen:Smith\tI-PER\nen:lives\tO\nen:in\tO\nen:Paris\tB-LOC\n\n"
                  "en:The\tO\nen:United\tB-ORG\nen:Nations\tI-ORG\nen:met\tO\n")


def config_name(method: str, mode: str) -> str:
    return f"{mode}/{method}"


def make_config(args, method: str, mode: str, ner_dir: str) -> Config:
    D = args.d_model
    over = {"model": {"arch": "encoder", "d_model": D, "n_layers": args.layers, "d_ff": 4 * D,
                      "n_heads": args.heads},
            "data": {"seq_len": args.seq_len, "batch_size": args.batch},
            "task": {"name": "ner", "dir": ner_dir, "init_from": args.hf or ""},
            # the step that runs the backbone; the cached FE step is timed end to end (--unit)
            "fusion": {"method": method, "mode": mode, "cache": False,
                       **own_settings(method, args)},
            "optim": {"name": "adamw", "lr": 5e-5},
            "run": {"steps": 1000, "seed": args.seed},
            "mesh": {"data": args.data_devices}}
    if args.hf:  # the backbone is the source's (task.init_from), its model not given here
        over["model"] = {"arch": "encoder"}
    return apply_overrides(Config(), over)


def layout_positions(seq_len: int, n_labelled: int) -> np.ndarray:
    """First sub-tokens: every other position after [CLS] (1, 3, 5, ...), or every position
    after it when that does not fit; the last position ([SEP]) is never labelled."""
    if n_labelled < 1 or n_labelled > seq_len - 2:
        raise SystemExit(f"--labelled {n_labelled}: needs 1 <= P <= seq_len - 2 = {seq_len - 2}")
    stride = 2 if 1 + 2 * (n_labelled - 1) <= seq_len - 2 else 1
    return 1 + stride * np.arange(n_labelled, dtype=np.int32)


def synthetic_batch(batch: int, seq_len: int, n_labelled: int, vocab: int, n_labels: int,
                    seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, size=(batch, seq_len), dtype=np.int32)
    pos = layout_positions(seq_len, n_labelled)
    return {"tokens": tokens,
            "segments": np.zeros((batch, seq_len), np.int32),
            "mask": np.ones((batch, seq_len), np.int32),
            "positions": np.broadcast_to(pos, (batch, n_labelled)).copy(),
            "labels": rng.integers(0, n_labels, size=(batch, n_labelled), dtype=np.int32)}


def _copy_arrays(tree):
    """Fresh buffers (the train step donates its state, so nothing may be shared)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, tree)


def backbone_fns(backbone):
    """Jitted forward and value_and_grad of mean(h_L^2) w.r.t. the backbone, no dropout."""
    def scalar(bb, tokens, mask, segments):
        h_BTD = bb(tokens, mask, segments)[0]
        return jnp.mean(jnp.square(h_BTD.astype(jnp.float32)))

    fwd = eqx.filter_jit(scalar)
    vag = eqx.filter_jit(eqx.filter_value_and_grad(scalar))
    return fwd, vag


def _same_arrays(a, b) -> bool:
    la, lb = jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array))
    return len(la) == len(lb) and all(x.shape == y.shape and bool(np.array_equal(x, y))
                                      for x, y in zip(la, lb))


def analytic_flops(B: int, T: int, P: int, L: int, d: int, d_ff: int) -> dict:
    """Forward FLOPs (2 per multiply-add, matmuls only) of the backbone and the fusion modules."""
    per_layer_token = 2 * (4 * d * d + 2 * d * d_ff) + 2 * 2 * T * d  # projections + QK^T, AV
    backbone = B * T * L * per_layer_token
    dwatt = B * P * (L + 1) * 2 * d * d  # L value bottlenecks + the query one (d -> d/2 -> d)
    concat = B * P * 2 * L * d * d
    return {"backbone_forward": backbone, "dwatt_forward": dwatt, "concat_forward": concat,
            "base+n_forward": B * T * per_layer_token,
            "dwatt_over_backbone_forward": dwatt / backbone,
            "note": "train step ~ 3x forward for trained parts; FE runs the backbone forward only"}


def print_table(res: dict) -> None:
    t = res["step_s"]
    base_fe = t[config_name("base", "fe")]

    def row(m: str) -> str:
        fe, ft = t[config_name(m, "fe")], t[config_name(m, "ft")]
        c = res["checks"]["ft_minus_fe"][m]
        return (f"{m:>8} {1e3 * fe:>9.2f} {1e3 * ft:>9.2f} {1e3 * c['ft_minus_fe_s']:>9.2f} "
                f"{c['ratio']:>8.2f} {fe / base_fe:>10.3f}")

    _print_rows(f"{'method':>8} {'FE ms':>9} {'FT ms':>9} {'FT-FE ms':>9} {'/bb bwd':>8} "
                f"{'FE/base FE':>10}", (row(m) for m in res["methods"]))
    bb = res["backbone"]
    print(f"backbone: forward {1e3 * bb['forward_s']:.2f} ms, value_and_grad "
          f"{1e3 * bb['value_and_grad_s']:.2f} ms, backward {1e3 * bb['backward_s']:.2f} ms")
    c = res["checks"]
    print(f"dwatt_fe_over_base_fe {c['dwatt_fe_over_base_fe']:.3f} (target <= {DWATT_TARGET}: "
          f"{'met' if c['dwatt_fe_within_target'] else 'MISSED'}); ft_minus_fe >= backbone "
          f"backward for every method: {'met' if c['ft_minus_fe_all_within_target'] else 'MISSED'}")


def main(argv: list[str] | None = None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--labelled", type=int, default=16, help="labelled positions P per row")
    p.add_argument("--extra-layers", type=int, default=1, help="n of base+n")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   help="methods to time (base and dwatt are always included: the target)")
    p.add_argument("--data-devices", type=int, default=-1,
                   help="mesh.data: devices on the data axis (-1: all)")
    p.add_argument("--hf", default="", help="a Hugging Face BERT/RoBERTa directory as backbone "
                                            "(task.init_from); --d-model/--layers/--heads ignored")
    p.add_argument("--out", default="runs/bench/bench_fusion.json")
    u = p.add_argument_group("--unit: one few-shot FE unit end to end, cached vs uncached")
    u.add_argument("--unit", action="store_true")
    u.add_argument("--ner-dir", default="", help="a WikiAnn or CoNLL-2003 directory")
    u.add_argument("--unit-method", choices=METHODS, default="dwatt")
    u.add_argument("--shots", type=int, default=64, help="task.n_shot")
    u.add_argument("--steps", type=int, default=300)
    u.add_argument("--eval-every", type=int, default=50)
    u.add_argument("--eval-max", type=int, default=500, help="dev/test sentences scored")
    g = p.add_argument_group("--grid: the FE half of the miniature few-shot grid, cached vs not")
    g.add_argument("--grid", action="store_true")
    g.add_argument("--backbone", default="", help="a pretrained run or HF directory for --grid; "
                   "empty: the experiment's miniature pretraining, once, untimed")
    g.add_argument("--workdir", default="", help="where --grid runs (kept); default: a temporary "
                   "directory")
    g.add_argument("--grid-extra", default="", help="more fusion_fewshot arguments for --grid, "
                   "e.g. \"--methods base dwatt --shots 8 --trials 1\"")
    args = p.parse_args(argv)
    if args.unit:
        return unit_benchmark(args)
    if args.grid:
        return grid_benchmark(args)
    args.methods = [m for m in METHODS if m in {"base", "dwatt", *args.methods}]
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")

    tmp = tempfile.TemporaryDirectory(prefix="bench_fusion_")
    try:
        return _run(args, tmp.name)
    finally:
        tmp.cleanup()


def unit_benchmark(args) -> dict:
    """Wall time of one FE unit with the backbone states cached and without; the F1 curves
    must agree."""
    if not args.ner_dir:
        raise SystemExit("--unit needs --ner-dir (a WikiAnn or CoNLL-2003 directory)")
    D = args.d_model
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench_fusion_unit_") as tmp:
        for cache in CACHE_ORDER:
            over = {"data": {"seq_len": args.seq_len, "batch_size": args.batch},
                    "task": {"name": "ner", "dir": args.ner_dir, "init_from": args.hf,
                             "n_shot": args.shots, "seed": args.seed, "eval_max": args.eval_max},
                    "fusion": {"method": args.unit_method, "mode": "fe", "cache": cache,
                               **own_settings(args.unit_method, args)},
                    "optim": {"name": "adamw", "lr": 1e-3, "schedule": "linear",
                              "warmup_steps": 0, "min_lr_ratio": 0.0},
                    "mesh": {"data": args.data_devices},
                    "run": {"dir": f"{tmp}/cache_{cache}", "steps": args.steps,
                            "eval_every": args.eval_every, "save_every": args.steps,
                            "log_every": args.steps, "progress": False, "samples": 0,
                            "seed": args.seed}}
            if not args.hf:
                over["model"] = {"arch": "encoder", "d_model": D, "n_layers": args.layers,
                                 "d_ff": 4 * D, "n_heads": args.heads}
            t0 = time.perf_counter()
            summary = train(apply_overrides(Config(), over))
            wall = time.perf_counter() - t0
            evals = [json.loads(line) for line in
                     (Path(tmp) / f"cache_{cache}" / "evals.jsonl").read_text().splitlines()]
            runs["cached" if cache else "uncached"] = {
                "wall_s": wall, "best_dev_f1": summary["best_dev_f1"],
                "test_f1_at_best": summary["test_f1_at_best"],
                "f1_curve": [(r["step"], r["dev_f1"], r["test_f1"]) for r in evals]}
            print(f"  {'cached' if cache else 'uncached'}: {wall:.1f} s, best dev F1 "
                  f"{summary['best_dev_f1']:.4f}", flush=True)
    speedup = runs["uncached"]["wall_s"] / runs["cached"]["wall_s"]
    same = runs["uncached"]["f1_curve"] == runs["cached"]["f1_curve"]
    res = {"benchmark": "bench_fusion --unit", "ner_dir": args.ner_dir,
           "backbone_source": args.hf or f"fresh encoder d {D} x {args.layers} layers",
           "method": args.unit_method, "mode": "fe", "n_shot": args.shots, "steps": args.steps,
           "batch": args.batch, "seq_len": args.seq_len, "eval_every": args.eval_every,
           "eval_max": args.eval_max, "order": "cached first, then uncached", **runs,
           "speedup": speedup, "target": UNIT_TARGET, "within_target": bool(speedup >= UNIT_TARGET),
           "same_f1_at_every_evaluation": bool(same), **environment()}
    print(f"FE unit end to end: uncached {runs['uncached']['wall_s']:.1f} s, cached "
          f"{runs['cached']['wall_s']:.1f} s: {speedup:.2f}x (target >= {UNIT_TARGET}: "
          f"{'met' if speedup >= UNIT_TARGET else 'MISSED'}); same F1 at every evaluation: {same}")
    print(f"wrote {write_json(args.out, res)}")
    return res


def grid_benchmark(args) -> dict:
    """Wall time of `fusion_fewshot all --preset miniature --modes fe` with the backbone's
    states cached and without (each in a fresh process, as a user runs it); every unit's
    best dev F1, test F1 and best step must agree."""
    if not args.ner_dir:
        raise SystemExit("--grid needs --ner-dir (a WikiAnn or CoNLL-2003 directory)")
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="bench_fusion_grid_")
    work = Path(args.workdir or tmp.name)
    base = fewshot_grid_command(args.ner_dir, args.grid_extra)
    backbone = args.backbone or fewshot_backbone(base, work)
    # the uncached way repeats --grid-extra's --finetune list with the cache off
    runs = two_ways(base, {"cached": ["--backbone", backbone],
                           "uncached": ["--backbone", backbone, "--finetune", "fusion.cache=false",
                                        *last_list(base, "--finetune")]},
                    work, lambda out: fewshot_units(out))
    speedup = runs["uncached"]["wall_s"] / runs["cached"]["wall_s"]
    same = runs["uncached"]["results"] == runs["cached"]["results"]
    apart = drift(runs["cached"]["results"], runs["uncached"]["results"])
    res = {"benchmark": "bench_fusion --grid", "ner_dir": args.ner_dir, "backbone": backbone,
           "command": " ".join(base[1:]), "order": "cached first, then uncached", **runs,
           "speedup": speedup, "target": GRID_TARGET,
           "within_target": bool(speedup >= GRID_TARGET), "same_results_every_unit": bool(same),
           "drift": apart,
           **environment()}
    print(f"FE half of the miniature grid: uncached {runs['uncached']['wall_s']:.1f} s, cached "
          f"{runs['cached']['wall_s']:.1f} s: {speedup:.2f}x (target >= {GRID_TARGET}: "
          f"{'met' if speedup >= GRID_TARGET else 'MISSED'}); same results in every unit: {same}")
    print(f"wrote {write_json(args.out, res)}")
    if tmp is not None:
        tmp.cleanup()
    return res


def _run(args, ner_dir: str) -> dict:
    methods = tuple(args.methods)
    (Path(ner_dir) / "train").write_text(WIKIANN_SAMPLE)
    labels = ner_labels(ner_dir)
    cfg0 = make_config(args, "base", "fe", ner_dir)
    mesh = make_mesh(cfg0.mesh)
    if args.batch % mesh.shape["data"]:
        raise SystemExit(f"--batch {args.batch} is not divisible by the data axis "
                         f"({mesh.shape['data']} devices); pick a multiple")
    b_sh, trial_sh = batch_sharding(mesh), batch_sharding(mesh, 1)

    steps, states, first_call, bb_ref, same_backbone, hf_step = {}, {}, {}, None, True, None
    hf_backbone = None
    for mode in MODES:
        for method in methods:
            name = config_name(method, mode)
            cfg = make_config(args, method, mode, ner_dir)
            tx = make_optimizer(cfg.optim, cfg.run.steps)
            try:  # a --seq-len past an --hf backbone's positions is refused here (FusionTask)
                task = task_for(cfg)
            except ConfigError as e:
                raise SystemExit(f"--seq-len {args.seq_len}: {e}") from None
            _, shardings = state_shardings([cfg], tx, mesh, task)  # one trial, on its axis
            # init_one run eagerly then placed (what initialise does, minus compiling one
            # init program per configuration, which costs more than the benchmark itself)
            state = eqx.filter_shard(stack([init_one(cfg, tx, task)]), shardings)
            if args.hf:  # the task's loader once; every configuration gets its own copy
                if hf_backbone is None:
                    model = task.initial_model(mesh, state.models().one(0))
                    hf_step, hf_backbone = task.init_step, model.backbone
                state = eqx.tree_at(lambda s: s.model.backbone, state, jax.tree.map(
                    lambda x: x[None], _copy_arrays(hf_backbone)))
                state = eqx.filter_shard(state, shardings)
            backbone = state.models().one(0).backbone
            if bb_ref is None:
                bb_ref = _copy_arrays(backbone)  # for the backbone-only timings
            else:
                same_backbone &= _same_arrays(bb_ref, backbone)
            steps[name] = make_step([cfg], mesh, shardings, [task])
            states[name] = state

    L, d = depth_and_width(bb_ref)
    bcfg = bb_ref.cfg
    if args.seq_len > bcfg.max_positions - bcfg.position_offset:
        raise SystemExit(f"--seq-len {args.seq_len} exceeds the backbone's positions")
    batch_np = synthetic_batch(args.batch, args.seq_len, args.labelled, bcfg.vocab_size,
                               len(labels), args.seed)
    data = {k: jax.device_put(v, b_sh) for k, v in batch_np.items()}
    one_trial = {k: jax.device_put(v[None], trial_sh) for k, v in batch_np.items()}
    bb_args = (data["tokens"], data["mask"], data["segments"])
    fwd, vag = backbone_fns(bb_ref)
    print(f"fusion step benchmark: backbone {'HF ' + args.hf if args.hf else 'fresh encoder'} "
          f"(L {L}, d {d}, heads {bcfg.n_heads}, d_ff {bcfg.d_ff}, vocab {bcfg.vocab_size}), "
          f"B {args.batch}, T {args.seq_len}, P {args.labelled}; {mesh.size} x "
          f"{jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)

    def call(name):
        if name == "backbone_forward":
            return fwd(bb_ref, *bb_args)
        if name == "backbone_value_and_grad":
            return vag(bb_ref, *bb_args)
        states[name], metrics = steps[name](states[name], one_trial)
        return states[name], metrics

    names = [config_name(m, mode) for mode in MODES for m in methods] + list(BACKBONE_PATHS)
    losses = {}

    def warm(name):  # the first call compiles; it is not timed
        out, first_call[name] = timed(call, name)
        if name not in BACKBONE_PATHS:
            losses[name] = float(out[1]["loss"][0])
        print(f"  compiled {name}: first call {first_call[name]:.2f} s", flush=True)

    t0 = time.perf_counter()
    for name in names:
        warm(name)
    compile_wall = time.perf_counter() - t0

    # interleaved rounds, rotating the order
    times = interleaved_times({name: partial(call, name) for name in names}, args.repeats)
    med = {name: statistics.median(v) for name, v in times.items()}

    t_fwd, t_vag = med["backbone_forward"], med["backbone_value_and_grad"]
    bwd = t_vag - t_fwd
    step_s = {name: med[name] for name in names if name not in BACKBONE_PATHS}
    dwatt_ratio = step_s[config_name("dwatt", "fe")] / step_s[config_name("base", "fe")]
    per_method = {}
    for m in methods:
        diff = step_s[config_name(m, "ft")] - step_s[config_name(m, "fe")]
        per_method[m] = {"ft_minus_fe_s": diff, "backbone_backward_s": bwd,
                         "ratio": diff / bwd if bwd > 0 else float("nan"),
                         "within_target": bool(diff >= bwd)}
    checks = {
        "dwatt_fe_over_base_fe": dwatt_ratio,
        "dwatt_fe_target": DWATT_TARGET,
        "dwatt_fe_within_target": bool(dwatt_ratio <= DWATT_TARGET),
        "ft_minus_fe": per_method,
        "ft_minus_fe_target": "ft_minus_fe_s >= backbone_backward_s (ratio >= 1)",
        "ft_minus_fe_all_within_target": all(v["within_target"] for v in per_method.values()),
    }
    res = {
        "benchmark": "bench_fusion",
        "backbone_source": args.hf or "fresh model.arch=encoder",
        "hf_source_step": hf_step,
        "n_layers": L, "d_model": d, "n_heads": bcfg.n_heads, "d_ff": bcfg.d_ff,
        "vocab_size": bcfg.vocab_size, "seq_len": args.seq_len, "batch": args.batch,
        "labelled": args.labelled, "extra_layers": args.extra_layers, "n_labels": len(labels),
        "positions": batch_np["positions"][0].tolist(),
        "repeats": args.repeats, "seed": args.seed, "optimizer": "adamw lr 5e-5",
        "same_backbone_all_configs": bool(same_backbone),
        **environment(device_count=mesh.size),
        "timing": "median of --repeats block_until_ready calls after one compiling call; all "
                  "configurations and the backbone functions interleaved, rotating order",
        "methods": list(methods), "modes": list(MODES),
        "step_s": step_s,
        "step_s_min": {n: min(times[n]) for n in step_s},
        "step_s_all": {n: times[n] for n in step_s},
        "first_call_s": first_call,
        "warmup_wall_s": compile_wall,
        "initial_loss": losses,
        "backbone": {"forward_s": t_fwd, "value_and_grad_s": t_vag, "backward_s": bwd,
                     "scalar": "mean(h_L ** 2), grad w.r.t. every backbone array, no dropout",
                     "forward_s_all": times["backbone_forward"],
                     "value_and_grad_s_all": times["backbone_value_and_grad"]},
        "backbone_backward_s": bwd,
        "analytic_flops": analytic_flops(args.batch, args.seq_len, args.labelled, L, d, bcfg.d_ff),
        "checks": checks,
    }
    print_table(res)
    print(f"wrote {write_json(args.out, res)}")
    return res


if __name__ == "__main__":
    main()
