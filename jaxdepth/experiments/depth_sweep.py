"""Petty et al., end to end: depth sweep, perplexity-matched and equal-loss comparisons,
feed-forward rank, and the paper's tables and figures. One command per step:

    python -m jaxdepth.experiments.depth_sweep run        --out DIR [plan options]
    python -m jaxdepth.experiments.depth_sweep matched    --out DIR
    python -m jaxdepth.experiments.depth_sweep equal-loss --out DIR [--threshold X]
    python -m jaxdepth.experiments.depth_sweep rank       --out DIR
    python -m jaxdepth.experiments.depth_sweep report     --out DIR
    python -m jaxdepth.experiments.depth_sweep all        --out DIR [plan options]

`run` pretrains every depth of a size class for every seed, then fine-tunes each final
checkpoint on every task, and the plan's `scratch` depths from fresh weights as well. The
plan is written to DIR/sweep.json by the first command; later commands read it, and a
different plan for the same DIR is refused. Every finished unit writes its row to
DIR/results/<unit>.json (whole, with its provenance) and is skipped when the command runs
again; an interrupted unit resumes from its own checkpoints. Runs live in DIR/pretrain/L<d>-s<seed>
and DIR/finetune/<task>/L<d>-s<seed>[-matched|-scratch].

Pretraining evaluates validation perplexity at every checkpoint and keeps every checkpoint,
since the perplexity-matched comparison picks intermediate ones.
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

from .executors import add_executor_args
from .experiment import (PlanData, PlannedExperiment, Unit, command_main, nested, overrides,
                         start_unit_process, trained)
from ..config import TASKS, Config, ConfigError, apply_overrides
from ..config.trials import SEED_FIELD, parse_list
from ..models.depth_family import SIZE_CLASSES
from ..config.presets import PAPER_FINETUNING, from_preset


@dataclass(frozen=True)
class Plan(PlanData):
    size: str = "tiny"
    depths: tuple[int, ...] = ()  # empty: every depth of the size class
    seeds: tuple[int, ...] = (0, 1)
    tasks: tuple[str, ...] = ("semantic_parsing", "passivization")
    task_dirs: dict = field(default_factory=dict)  # task -> directory of its published files
    pretrain: dict = field(default_factory=dict)  # "section.field" -> value
    finetune: dict = field(default_factory=dict)
    # Depths also fine-tuned from fresh weights (every seed, same tokenizer and recipe): the
    # control that shows what pretraining adds. Rows have init "scratch".
    scratch: tuple[int, ...] = ()
    # Whether `all` runs the perplexity-matched fine-tunings (Fig. 6); `matched` always does.
    matched: bool = True

    def __post_init__(self):
        if self.size not in SIZE_CLASSES:
            raise ConfigError(f"size: unknown size class {self.size!r}; known: "
                              f"{sorted(SIZE_CLASSES)}")
        bad = [d for d in self.depths if d not in SIZE_CLASSES[self.size].depths]
        if bad:
            raise ConfigError(f"depths: {bad} not in the {self.size} family "
                              f"{SIZE_CLASSES[self.size].depths}")
        # A control takes its tokenizer from the pretraining run of its depth and seed.
        bad = [d for d in self.scratch if d not in self.family]
        if bad:
            raise ConfigError(f"scratch: {bad} not among the depths this plan pretrains "
                              f"{self.family}; set --scratch")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ConfigError(f"tasks: unknown {unknown}; known: {list(TASKS)}")
        if not self.seeds:
            raise ConfigError("seeds: at least one seed")

    @property
    def family(self) -> tuple[int, ...]:
        return self.depths or SIZE_CLASSES[self.size].depths


# The miniature sweep (docs/depth.md): the CPU-scale "tiny" family on the embedded grammar, 3
# depths x 5 seeds (2 left every interval too wide) x 2 tasks plus a from-scratch control.
# Measured choices: 4 attention heads of 16 (one head of 64 never learns to copy the nouns of
# semantic parsing), 20,000 packed training examples (2,000 are memorised), Adafactor (AdamW at
# 3e-3 reached 1% exact match where it reached 88%). `matched` runs the perplexity-matched
# fine-tunings (Fig. 6).
MINIATURE = Plan(
    size="tiny", depths=(1, 2, 4), seeds=(0, 1, 2, 3, 4),
    tasks=("semantic_parsing", "passivization"),
    pretrain={"model.n_heads": 4, "run.steps": 400, "run.save_every": 100},
    finetune={"run.steps": 800, "run.eval_every": 400, "run.save_every": 800,
              "data.batch_size": 32, "data.seq_len": 192, "model.dropout": 0.0,
              "optim.name": "adafactor", "optim.lr": 0.05, "optim.schedule": "cosine",
              "optim.warmup_steps": 50, "optim.min_lr_ratio": 0.1, "optim.weight_decay": 0.0,
              "optim.clip_norm": 1.0,
              "task.n_train": 20000, "task.n_eval": 100, "task.eval_max": 100,
              "task.pack": True},
    scratch=(4,), matched=False,
)
# The paper's first finding (Figs. 2 and 3), perplexity against depth at equal size, on a text
# corpus the user names (`--pretrain data.corpus=PATH --pretrain data.valid=PATH`, e.g.
# WikiText-2 from `python -m jaxdepth.data.download wikitext-2`); the held-out perplexity is
# data.valid's. Pretraining only, with the miniature's pretraining recipe; `--size small` for
# the small family.
ENGLISH = Plan(
    size="tiny", seeds=(0, 1, 2, 3, 4), tasks=(),
    pretrain={"model.n_heads": 4, "run.steps": 400, "run.save_every": 200, "data.corpus": ""},
    matched=False,
)
# Fine-tuning defaults of the paper (t5x); a plan's `finetune` entries override them.
PAPER_FINETUNE = {f"{sec}.{k}": v for sec, vals in PAPER_FINETUNING.items()
                  for k, v in vals.items()}
PLANS = {"miniature": MINIATURE, "english": ENGLISH}


class Sweep(PlannedExperiment):
    PLAN_FILE = "sweep.json"
    PLAN = Plan
    MODULE = "jaxdepth.experiments.depth_sweep"
    threshold: float | None = None  # equal-loss's dev-loss threshold; None: the common one

    @staticmethod
    def result_name(row: dict) -> str:
        """pretrain-L4-s0, finetune-passivization-L4-s0[-scratch|-matched],
        equal_loss-passivization-L4-s0-0.1234: one seed's result (a unit's name with
        --sequential)."""
        where = f"L{row['depth']}-s{row['seed']}"
        if row["kind"] == "pretrain":
            return f"pretrain-{where}"
        if row["kind"] == "finetune":
            init = row.get("init", "final")
            return f"finetune-{row['task']}-{where}" + ("" if init == "final" else f"-{init}")
        return f"{row['kind']}-{row['task']}-{where}-{row['threshold']!r}"

    def done(self, **key) -> dict | None:
        for r in self.rows():
            if all(r.get(k) == v for k, v in key.items()):
                return r
        return None

    def append(self, row: dict) -> None:
        self.record({"size_class": self.plan.size, **row})

    # ------------------------------------------------------------------ configs

    def pretrain_dir(self, depth: int, seed: int) -> Path:
        return self.out / "pretrain" / f"L{depth}-s{seed}"

    def finetune_dir(self, task: str, depth: int, seed: int, init: str) -> Path:
        suffix = "" if init == "final" else f"-{init}"
        return self.out / "finetune" / task / f"L{depth}-s{seed}{suffix}"

    def pretrain_config(self, depth: int, seed: int) -> Config:
        cfg = apply_overrides(from_preset(f"{self.plan.size}-L{depth}"),
                              nested(self.plan.pretrain))
        every = cfg.run.save_every
        return apply_overrides(cfg, {"run": {
            "dir": str(self.pretrain_dir(depth, seed)), "seed": seed, "progress": False,
            "samples": 0, "eval_every": every, "keep": cfg.run.steps // every + 1}})

    def finetune_config(self, task: str, depth: int, seed: int, init: str,
                        init_step: int) -> Config:
        base = self.pretrain_config(depth, seed)
        cfg = apply_overrides(base, nested({**PAPER_FINETUNE, **self.plan.finetune}))
        pretrained = self.pretrain_dir(depth, seed)
        # The from-scratch control keeps the pretrained runs' tokenizer, so only the weights differ.
        start = ({"task": {"init_from": "", "init_step": 0},
                  "data": {"tokenizer": str(pretrained / "data" / "tokenizer.model")}}
                 if init == "scratch" else
                 {"task": {"init_from": str(pretrained), "init_step": init_step}})
        cfg = apply_overrides(cfg, start)
        return apply_overrides(cfg, {
            "task": {"name": task, "dir": self.plan.task_dirs.get(task, "")},
            "run": {"dir": str(self.finetune_dir(task, depth, seed, init)), "seed": seed,
                    "progress": False, "samples": 0, "keep": 1}})

    # ------------------------------------------------------------------ steps

    # Trials (trainer/trials.py): by default the seeds of one depth (pretraining) or of one
    # depth, task and start (fine-tuning) train as one program, in L<d>-seeds-<s-...>/, and
    # each trial is exported to the directory its solo run would have, which everything after
    # reads; `sequential` (--sequential) trains one program per seed.

    @staticmethod
    def trials_dir(solo_dir: Path, seed: int, seeds: list[int]) -> Path:
        """L4-s0[-scratch] -> L4-seeds-0-1-2[-scratch]: the run the trials train in."""
        return solo_dir.with_name(solo_dir.name.replace(
            f"-s{seed}", "-seeds-" + "-".join(map(str, seeds)), 1))

    @staticmethod
    def _per_seed(path: str, seed: int) -> str:
        """A path of seed `seed`'s pretraining run (its last component ends -s<seed>), with
        that seed as config.trials.SEED_FIELD: each trial reads its own."""
        if not path:
            return path
        p = Path(path)
        parts = p.parts
        i = next(i for i in range(len(parts) - 1, -1, -1) if parts[i].endswith(f"-s{seed}"))
        return str(Path(*parts[:i], parts[i][:-len(str(seed))] + SEED_FIELD, *parts[i + 1:]))

    def _as_trials(self, what: str, configs: dict[int, Config], on_done) -> None:
        """Train configs (seed -> its solo config) as trials of one run (a single seed: its
        solo run), then on_done(seed, summary) for each seed, the trial exported to its solo
        run's directory first."""
        from ..tasks import train

        seeds = sorted(configs)
        if len(seeds) == 1:
            self.units_run += 1
            on_done(seeds[0], trained(f"{what} seed {seeds[0]}", train, configs[seeds[0]]))
            return
        first = configs[seeds[0]]
        run_dir = self.trials_dir(Path(first.run.dir), seeds[0], seeds)
        per_seed = {"task": {"init_from": self._per_seed(first.task.init_from, seeds[0])}}
        if first.data.tokenizer and not first.task.init_from:  # the from-scratch control
            per_seed["data"] = {"tokenizer": self._per_seed(first.data.tokenizer, seeds[0])}
        cfg = apply_overrides(first, {"run": {"dir": str(run_dir),
                                              "seeds": ",".join(map(str, seeds))}, **per_seed})
        summaries = self.train_as_trials(f"{what} seeds {seeds}", cfg,
                                         [configs[seed] for seed in seeds])
        for seed, s in zip(seeds, summaries):
            on_done(seed, s)

    def seed_groups(self) -> list[list[int]]:
        """The plan's seeds, per_group at a time (the last group the rest), each group one
        program per depth, task and start; all of them when per_group is None."""
        seeds, g = list(self.plan.seeds), self.per_group or len(self.plan.seeds)
        return [seeds[i:i + g] for i in range(0, len(seeds), g)]

    def _suffix(self, group: list[int]) -> str:
        if self.per_group is None:
            return ""
        return f"-s{group[0]}" if self.per_group == 1 else "-seeds-" + "-".join(map(str, group))

    def schedule(self) -> list[Unit]:
        """The plan's units, each one program, in the order they start: group by group of
        seeds (seed_groups), a group's pretrainings, then its fine-tunings, so that a group's
        units finish together and a long sweep cut off for good loses only the seeds in
        flight; a fine-tuning unit after the pretraining it starts from (from fresh weights
        too: it takes that run's tokenizer). Deepest first: on the CPU a family's deeper
        member is the slower one at equal size, and a pool of workers ends sooner starting the
        longest. Then the analyses: the perplexity-matched fine-tunings (if the plan has
        them) after every pretraining, the report after everything."""
        p = self.plan
        depths = sorted(p.family, reverse=True)
        units: list[Unit] = []
        for g in self.seed_groups():
            at, seeds = self._suffix(g), f"seed{'s' if len(g) > 1 else ''} {', '.join(map(str, g))}"
            results = {d: tuple(self.result_name(dict(kind="pretrain", depth=d, seed=s))
                                for s in g) for d in depths}
            pretrain = {d: Unit(f"pretrain-L{d}{at}", f"pretraining of {p.size}-L{d}, {seeds}",
                                (), functools.partial(self.pretrain_seeds, d, g),
                                self.all_done(results[d]), results=results[d]) for d in depths}
            units += pretrain.values()
            for d in depths:
                for init in ("final", "scratch") if d in p.scratch else ("final",):
                    for task in p.tasks:
                        results = tuple(self.result_name(dict(
                            kind="finetune", task=task, depth=d, seed=s, init=init)) for s in g)
                        start = "fresh weights" if init == "scratch" else "its pretraining"
                        units.append(Unit(
                            f"finetune-{task}-L{d}{at}" + ("-scratch" if init == "scratch" else ""),
                            f"fine-tuning of {p.size}-L{d} on {task} from {start}, {seeds}",
                            (pretrain[d].name,),
                            functools.partial(self.finetune_seeds, task, d, init, g),
                            self.all_done(results), results=results))
        training = tuple(u.name for u in units)
        if p.matched:
            units.append(Unit("matched", "fine-tuning from the perplexity-matched checkpoints "
                              "(Fig. 6)", tuple(u.name for u in units if u.name.startswith(
                                  "pretrain")), self.matched,
                              lambda: (self.out / "matched.done").is_file(), analysis=True))
        units.append(Unit("report", "equal-loss points, feed-forward rank and the report",
                          training + (("matched",) if p.matched else ()), self.analyses,
                          lambda: False, analysis=True))
        return units

    def units(self) -> list[str]:
        """The names of the results the training units write, in the order they start."""
        return [name for u in self.schedule() for name in u.results]

    def analyses(self) -> None:
        """The report unit: equal-loss points, feed-forward rank, tables and figures."""
        if self.plan.tasks:
            self.equal_loss(self.threshold)
        self.rank()
        self.report()

    def pretrain_seeds(self, depth: int, seeds: list[int]) -> None:
        """Pretrain every one of `seeds` at `depth` not done yet, as trials of one run."""
        from ..models.depth_family import param_count

        todo = [s for s in seeds if not self.done(kind="pretrain", depth=depth, seed=s)]
        if not todo:
            return

        def pretrained(seed: int, s: dict) -> None:
            cfg = self.pretrain_config(depth, seed)
            self.append({"kind": "pretrain", "depth": depth, "seed": seed,
                         "d_model": cfg.model.d_model, "d_ff": cfg.model.d_ff,
                         "params": param_count(cfg.model), "valid_ppl": s["valid_ppl"],
                         "valid_loss": s["valid_loss"], "step": s["step"],
                         "grammatical": s.get("grammatical"),  # embedded grammar only
                         "run_dir": self.relative(cfg.run.dir)})

        self._as_trials(f"pretrain L{depth}", {s: self.pretrain_config(depth, s) for s in todo},
                        pretrained)

    def finetune_seeds(self, task: str, depth: int, init: str, seeds: list[int]) -> None:
        """Fine-tune every one of `seeds` not done yet, from its own pretraining run (or
        from scratch), as trials of one run."""
        todo = [s for s in seeds
                if not self.done(kind="finetune", task=task, depth=depth, seed=s, init=init)]
        if todo:
            self._as_trials(f"fine-tune L{depth} on {task} ({init})",
                            {s: self.finetune_config(task, depth, s, init, 0) for s in todo},
                            lambda seed, s: self.append(self._finetune_row(
                                task, depth, seed, init, 0, s)))

    def _started_from(self, depth: int, seed: int, init: str, init_step: int,
                      s: dict) -> int | None:
        """The pretrained step a fine-tuning unit started from (None: from scratch). Its
        summary says so when this invocation started the unit; a unit resumed from its own
        checkpoint never reads the pretrained one, and its summary's init_step is None: then
        it is the step its config names, init_step, 0 naming the pretraining run's latest."""
        if s["init_step"] is not None or init == "scratch":
            return s["init_step"]
        if init_step:
            return init_step
        from ..trainer.checkpoint import open_manager
        mngr = open_manager(self.pretrain_dir(depth, seed), read_only=True)
        try:
            return mngr.latest_step()
        finally:
            mngr.close()

    def _finetune_row(self, task, depth, seed, init, init_step: int, s: dict) -> dict:
        run_dir = self.finetune_dir(task, depth, seed, init)
        return {"kind": "finetune", "task": task, "depth": depth, "seed": seed, "init": init,
                "init_step": self._started_from(depth, seed, init, init_step, s),
                "dev_loss": s["dev_loss"],
                **{k: s.get(k) for k in ("id_accuracy", "gen_accuracy", "lexical", "structural",
                                         "by_type")},
                "unk_examples": s["unk"]["examples_with_unk"], "run_dir": self.relative(run_dir)}

    def finetune(self, task: str, depth: int, seed: int, init: str, init_step: int) -> dict:
        from ..tasks import train

        key = dict(kind="finetune", task=task, depth=depth, seed=seed, init=init)
        row = self.done(**key)
        if row:
            return row
        cfg = self.finetune_config(task, depth, seed, init, init_step)
        self.units_run += 1
        s = trained(f"fine-tune L{depth} seed {seed} on {task} ({init})", train, cfg)
        row = self._finetune_row(task, depth, seed, init, init_step, s)
        self.append(row)
        return row

    def matched(self) -> None:
        """Fig. 6: per seed, reference = the shallowest depth's final validation perplexity;
        each deeper model is fine-tuned from its first checkpoint at or below it."""
        from ..analysis.matched import perplexity_matched
        from ..files import read_jsonl
        from ..trainer.checkpoint import open_manager

        p = self.plan
        for seed in p.seeds:
            runs = {}
            for depth in p.family:
                d = self.pretrain_dir(depth, seed)
                mngr = open_manager(d, read_only=True)
                runs[depth] = {"metrics_rows": read_jsonl(d / "metrics.jsonl"),
                               "saved_steps": sorted(mngr.all_steps())}
                mngr.close()
            m = perplexity_matched(runs)
            print(f"seed {seed}: reference L{m['reference_depth']} perplexity "
                  f"{m['reference_ppl']:.3f}; matched steps {m['steps']}", flush=True)
            for depth, step in m["steps"].items():
                if step is None:
                    print(f"  L{depth} never reaches it: no matched checkpoint", flush=True)
                    continue
                for task in p.tasks:
                    if step == runs[depth]["saved_steps"][-1]:  # the final checkpoint itself
                        if not self.done(kind="finetune", task=task, depth=depth, seed=seed,
                                         init="matched"):
                            final = self.finetune(task, depth, seed, "final", 0)
                            self.append({**final, "init": "matched", "size_class": p.size})
                    else:
                        self.finetune(task, depth, seed, "matched", step)
        (self.out / "matched.done").write_text("")  # the matched unit's done mark

    def equal_loss(self, threshold: float | None = None) -> None:
        """Fig. 7b: generalization at the first fine-tuning evaluation whose in-distribution
        loss reaches a threshold every run of the task reaches (or the one given)."""
        from ..analysis.matched import equal_loss_points
        from ..files import read_jsonl

        p = self.plan
        for task in p.tasks:
            logs = {(d, s): read_jsonl(self.finetune_dir(task, d, s, "final") / "evals.jsonl")
                    for d in p.family for s in p.seeds}
            points = equal_loss_points(logs, threshold)
            for (depth, seed), pt in points.items():
                row = pt["row"] or {}
                self.append({"kind": "equal_loss", "task": task, "depth": depth, "seed": seed,
                             "threshold": pt["threshold"], "step": pt["step"],
                             **{k: row.get(k) for k in ("dev_loss", "gen_accuracy", "lexical",
                                                        "structural", "id_accuracy")}})
            print(f"{task}: common dev-loss threshold {pt['threshold']:.4f}", flush=True)

    def rank(self) -> dict:
        """Figs. 10-11: spectra and effective rank of every feed-forward matrix of every
        final pretrained model; per-model outputs and the depth summary under analysis/."""
        from ..analysis.rank import ff_rank_table, write_rank_outputs, write_rank_vs_depth
        from ..tasks import load_model

        rows = []
        for seed in self.plan.seeds:
            for depth in self.plan.family:
                model, _, step = load_model(self.pretrain_dir(depth, seed))
                table = ff_rank_table(model)
                write_rank_outputs(table, self.out / "analysis" / "rank" / f"L{depth}-s{seed}",
                                   label=f"{self.plan.size} L{depth} seed {seed} step {step}")
                rows += [{"depth": depth, "seed": seed, **r} for r in table]
        paths = write_rank_vs_depth(rows, self.out / "analysis")
        for path in paths.values():
            print(f"rank vs depth: {path}")
        return paths

    def report(self) -> dict:
        """Every table and figure of the results there are; a plan's unit without a result
        (a sweep mid-way, a damaged record) is named in one line, and each table cell shows
        the seeds behind it."""
        from ..analysis.report import write_report
        from ..errors import warn

        rows = self.rows()
        done = {self.result_name(r) for r in rows}
        units = self.units()
        missing = [u for u in units if u not in done]
        if missing:
            warn(f"{len(missing)} of {len(units)} units have no result: "
                 f"{', '.join(missing)}; `python -m jaxdepth.experiments.depth_sweep run --out "
                 f"{self.out}` finishes them")
        paths = write_report(rows, self.out / "report")
        for name, path in paths.items():
            print(f"{name}: {path}")
        return paths


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m jaxdepth.experiments.depth_sweep",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "plan", "unit", "matched", "equal-loss", "rank",
                                       "report", "all"],
                   help="plan: save the plan (with plan options) and print its units as JSON; "
                        "unit NAME: run that unit alone (exit 75 while a unit it reads is not "
                        "done)")
    p.add_argument("name", nargs="?", help="unit: the unit's name, as `plan` lists it")
    p.add_argument("--out", required=True, help="sweep directory")
    p.add_argument("--preset", choices=sorted(PLANS), help="a ready-made plan")
    p.add_argument("--size", help="size class (41M, 134M, 374M, tiny, small)")
    p.add_argument("--depths", help="comma-separated depths (default: the whole family)")
    p.add_argument("--seeds", help="comma-separated seeds or ranges (0-44)")
    p.add_argument("--tasks", help="comma-separated tasks; 'none' to pretrain only")
    p.add_argument("--scratch", help="comma-separated depths also fine-tuned from fresh weights "
                                     "(the control without pretraining); 'none' for none")
    p.add_argument("--task-dir", action="append", default=[], metavar="TASK=DIR",
                   help="where a published task's files are (cogs=..., geoquery=...)")
    p.add_argument("--pretrain", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--finetune", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--threshold", type=float, default=None, help="equal-loss: dev-loss threshold")
    add_executor_args(p)
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    return p.parse_args(argv)


def plan_from_args(args) -> Plan | None:
    if not any([args.preset, args.size, args.depths, args.seeds, args.tasks, args.task_dir,
                args.pretrain, args.finetune, args.scratch]):
        return None
    base = PLANS[args.preset] if args.preset else Plan()
    changes: dict = {}
    if args.size:
        changes["size"] = args.size
    if args.depths:
        changes["depths"] = tuple(int(x) for x in args.depths.split(","))
    if args.seeds:
        changes["seeds"] = tuple(parse_list(args.seeds, int, "--seeds"))
    if args.tasks:
        changes["tasks"] = (() if args.tasks == "none"
                            else tuple(x.strip() for x in args.tasks.split(",")))
    if args.scratch:
        changes["scratch"] = (() if args.scratch == "none"
                              else tuple(int(x) for x in args.scratch.split(",")))
    if args.task_dir:
        changes["task_dirs"] = dict(item.split("=", 1) for item in args.task_dir)
    if args.pretrain:
        changes["pretrain"] = {**base.pretrain, **overrides(args.pretrain, "--pretrain")}
    if args.finetune:
        changes["finetune"] = {**base.finetune, **overrides(args.finetune, "--finetune")}
    plan = dataclasses.replace(base, **changes)
    if plan.pretrain.get("data.corpus") == "":  # a plan for a corpus the user names
        raise ConfigError("--pretrain data.corpus: this plan pretrains on a text corpus you "
                          "name: give --pretrain data.corpus=PATH (and data.valid=PATH for its "
                          "held-out split)")
    return plan


def main(argv=None) -> int:
    return command_main(parse, _run, argv)


def _run(args) -> int:
    start_unit_process(args)  # before anything starts XLA
    plan = plan_from_args(args)
    if args.command not in ("run", "all", "plan") and plan is not None:
        raise ConfigError(f"{args.command}: plan options belong to `run`/`all`/`plan`; "
                          f"this command reads {args.out}/sweep.json")
    sweep, executor = Sweep.from_args(args, plan)
    sweep.threshold = args.threshold
    if args.command == "all" and not sweep.plan.matched:
        print("the plan leaves out the perplexity-matched fine-tunings (Fig. 6); "
              "`matched` runs them", flush=True)
    if sweep.common_command(args, executor):
        return 0
    if args.command == "matched":
        sweep.matched()
    elif args.command == "equal-loss":
        sweep.equal_loss(args.threshold)
    elif args.command == "rank":
        sweep.rank()
    else:
        sweep.report()
    return 0


if __name__ == "__main__":
    from ..errors import exit_process
    from ..trainer.runtime import tune_malloc

    tune_malloc()  # the process is ours (see runtime.tune_malloc)
    exit_process(main())
