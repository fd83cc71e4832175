"""Depth-wise layer fusion, few-shot NER (the DWAtt paper's Figs. 3-4), end to end:

    python -m jaxdepth.experiments.fusion_fewshot run    --out DIR --ner-dir DIR [plan options]
    python -m jaxdepth.experiments.fusion_fewshot report --out DIR
    python -m jaxdepth.experiments.fusion_fewshot all    --out DIR --ner-dir DIR [plan options]

`run` trains every {method} x {mode} x {N-shot} x {trial} unit on one backbone through the
same trainer as ``train.py`` (task.name=ner): trial t samples its N * C training sentences with
seed t, and the unit's result is the best dev F1 over training with the test F1 at that point.
The backbone is ``--backbone`` (a Hugging Face BERT/RoBERTa directory or a run of this
project); without one, ``run`` first pretrains a small BERT encoder with MLM on the NER
training sentences (DIR/pretrain), so the whole experiment needs nothing but the NER files.

`plan` prints the units (the backbone's pretraining, one per {method, mode} cell, the report)
as JSON and `unit NAME` runs one, as depth_sweep's do (experiments/executors.py runs them:
here, on a pool of worker processes, on Ray or on SLURM). The plan is saved in DIR/plan.json
and a different plan for the same DIR is refused. Every
finished unit writes its row to DIR/results/<unit>.json and is skipped when the command runs
again; an interrupted unit resumes from its checkpoint. `report` writes DIR/report/: the table
of mean and 95% CI over trials (md, csv), F1 vs N-shot per method (Fig. 3) and dev F1 vs training
step (Fig. 4), as PNG.
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..config import FUSION_MODES, Config, ConfigError, apply_overrides
from ..models.fusions import fusion_methods, own_settings
from .executors import add_executor_args
from .experiment import (PlanData, PlannedExperiment, Unit, command_main, nested, overrides,
                         start_unit_process, trained)

# Few-shot fine-tuning as docs/design.md §4: AdamW, linear decay to 0, lr 5e-5, batch 16.
# Every optimizer field is pinned (β2 0.99, ε 1e-8, clipping 1.0: the values docs/fusion.md's
# tables were measured with), so the experiment does not follow the ner kind's recipe.
PINNED_ADAM = {"optim.b1": 0.9, "optim.b2": 0.99, "optim.eps": 1e-8, "optim.clip_norm": 1.0}
PAPER_FINETUNE = {"optim.name": "adamw", "optim.lr": 5e-5, "optim.schedule": "linear",
                  "optim.warmup_steps": 0, "optim.min_lr_ratio": 0.0, "optim.weight_decay": 0.01,
                  **PINNED_ADAM,
                  "data.batch_size": 16, "data.seq_len": 128, "run.steps": 1000,
                  "run.eval_every": 100, "task.eval_max": 0}

PRESETS = {
    "paper": {"shots": (8, 16, 32, 64, 128), "trials": 5, "finetune": PAPER_FINETUNE,
              "pretrain": {}},
    # Two CPU cores, under 30 minutes: a 4-layer d=128 encoder pretrained here for 600 steps,
    # 2 trials, 150 fine-tuning steps at lr 1e-3 (5e-5 moves a fresh head too little in 150
    # steps), dev/test capped at 300 sentences.
    "miniature": {
        "shots": (8, 16, 32, 64, 128), "trials": 2,
        "finetune": {**PAPER_FINETUNE, "optim.lr": 1e-3, "data.seq_len": 64, "run.steps": 150,
                     "run.eval_every": 25, "task.eval_max": 300},
        "pretrain": {"model.arch": "encoder", "model.d_model": 128, "model.n_layers": 4,
                     "model.d_ff": 512, "model.n_heads": 2, "model.vocab_size": 2000,
                     "model.dropout": 0.1, "data.seq_len": 64, "data.batch_size": 32,
                     "data.max_predictions": 10, "optim.name": "adamw", "optim.lr": 1e-3,
                     "optim.schedule": "linear", "optim.warmup_steps": 50,
                     "optim.min_lr_ratio": 0.0, "optim.weight_decay": 0.01, **PINNED_ADAM,
                     "run.steps": 600, "run.eval_every": 200,
                     "run.save_every": 600}},
}


@dataclass(frozen=True)
class Plan(PlanData):
    ner_dir: str
    backbone: str = ""  # HF directory or run; empty: pretrain one from `pretrain`
    methods: tuple[str, ...] = fusion_methods()  # every method of models/fusions/
    modes: tuple[str, ...] = tuple(FUSION_MODES)  # every fusion.mode
    shots: tuple[int, ...] = (8, 16, 32, 64, 128)
    trials: int = 5
    extra_layers: int = 1  # n of Base+n
    finetune: dict = field(default_factory=dict)  # "section.field" -> value
    pretrain: dict = field(default_factory=dict)

    def __post_init__(self):
        bad = [m for m in self.methods if m not in fusion_methods()]
        if bad:
            raise ConfigError(f"methods: unknown {bad}; known: {list(fusion_methods())}")
        if not set(self.modes) <= set(FUSION_MODES) or not self.modes:
            raise ConfigError(f"modes: must be {' and/or '.join(FUSION_MODES)}, got "
                              f"{list(self.modes)}")
        if not self.shots or min(self.shots) < 1:
            raise ConfigError(f"shots: positive N-shot values needed, got {list(self.shots)}")
        if self.trials < 1:
            raise ConfigError(f"trials: must be >= 1, got {self.trials}")
        if not self.backbone and not self.pretrain:
            raise ConfigError("backbone: give --backbone DIR, or a preset that pretrains one")


class Experiment(PlannedExperiment):
    PLAN = Plan
    MODULE = "jaxdepth.experiments.fusion_fewshot"

    @staticmethod
    def result_name(row: dict) -> str:
        return f"ner-{row['method']}-{row['mode']}-N{row['n_shot']}-t{row['seed']}"

    def schedule(self) -> list[Unit]:
        """The backbone's pretraining (without --backbone), then one unit per {method, mode}
        cell (its N-shot values x trials as trials of one program; with --sequential one per
        N-shot value and trial), then the report."""
        p = self.plan
        if self.per_group not in (None, 1):
            raise ConfigError(f"--seeds-per-group {self.per_group}: a cell's units train "
                              f"together (none) or one by one (1, --sequential)")
        units = []
        if not p.backbone:
            units.append(Unit("pretrain", "MLM pretraining of the backbone on the NER "
                              "training sentences", (), self.backbone,
                              lambda: (self.out / "pretrain" / "summary.json").is_file()))
        after = tuple(u.name for u in units)
        cells = [(shots, trial) for shots in p.shots for trial in range(p.trials)]
        for method in p.methods:
            for mode in p.modes:
                groups = [[c] for c in cells] if self.per_group == 1 else [cells]
                for g in groups:
                    names = tuple(self.result_name(dict(method=method, mode=mode, n_shot=n,
                                                        seed=t)) for n, t in g)
                    units.append(Unit(
                        names[0] if len(g) == 1 and self.per_group == 1 else
                        f"ner-{method}-{mode}",
                        f"{method} {mode} at N-shot {sorted({n for n, _ in g})}, "
                        f"trials {sorted({t for _, t in g})}", after,
                        functools.partial(self.cell, method, mode, g), self.all_done(names),
                        results=names))
        units.append(Unit("report", "the table and figures over the trials",
                          tuple(u.name for u in units), self.report, lambda: False,
                          analysis=True))
        return units

    def backbone(self) -> str:
        if self.plan.backbone:
            return self.plan.backbone
        run = self.out / "pretrain"
        if not (run / "summary.json").is_file():
            corpus = self.out / "pretrain_corpus.txt"
            if not corpus.is_file():
                write_corpus(self.plan.ner_dir, corpus)
            cfg = apply_overrides(Config(), nested({**self.plan.pretrain,
                                                      "data.corpus": str(corpus),
                                                      "run.dir": str(run), "run.progress": False}))
            _timed("pretraining the backbone", cfg)
        return str(run)

    def unit_config(self, backbone: str, method: str, mode: str, shots: int, trial: int) -> Config:
        run = self.out / "runs" / f"{method}-{mode}" / f"N{shots}-t{trial}"
        flat = {**self.plan.finetune, "task.name": "ner", "task.dir": self.plan.ner_dir,
                "task.init_from": backbone, "task.n_shot": shots, "task.seed": trial,
                "fusion.method": method, "fusion.mode": mode, "run.seed": trial,
                "run.dir": str(run), "run.progress": False,
                # the settings only this method reads (Base+n's extra_layers), from the plan
                **{f"fusion.{k}": v for k, v in own_settings(method, self.plan).items()}}
        flat.setdefault("run.save_every", flat.get("run.steps", Config().run.steps))
        return apply_overrides(Config(), nested(flat))

    def cell(self, method: str, mode: str, units: list[tuple[int, int]]) -> None:
        """The (N-shot, trial) units of a {method, mode} cell not done yet: every one of the
        cell as trials of one program, or one by one (a single unit, or a cell part done)."""
        import jax
        backbone = self.backbone()
        done = self.finished()
        todo = [u for u in units if self.result_name(dict(method=method, mode=mode, n_shot=u[0],
                                                          seed=u[1])) not in done]
        if not todo:
            return
        if len(todo) < len(units) or len(units) == 1:
            for shots, trial in todo:
                cfg = self.unit_config(backbone, method, mode, shots, trial)
                self.units_run += 1
                _timed(f"{method} {mode} N={shots} trial {trial}", cfg)
                self.append(cfg, method, mode, shots, trial)
                # Every unit compiles its own step: without this, the executables of all
                # units stay loaded and XLA runs out of memory maps after ~70.
                jax.clear_caches()
            return
        self.cell_as_trials(backbone, method, mode, units)
        jax.clear_caches()

    def report(self) -> None:
        from ..analysis.fusion_report import write_report
        for name, path in write_report(self.rows(), self.out / "report").items():
            print(f"{name}: {path}")

    def cell_as_trials(self, backbone: str, method: str, mode: str,
                       units: list[tuple[int, int]]) -> None:
        """Every (N-shot, trial) unit of one {method, mode} cell as a trial of one program
        (trainer/trials.py): the N-shot value and the trial's seed change which sentences it
        draws, not a shape. Each trial is then exported to its unit's directory."""
        p = self.plan
        first = self.unit_config(backbone, method, mode, *units[0])
        cfg = apply_overrides(first, {
            "run": {"dir": str(Path(first.run.dir).parent / "trials"),
                    "seeds": ",".join(map(str, range(p.trials)))},
            "trials": {"n_shot": ",".join(map(str, p.shots)), "task_seed": "seed"}})
        configs = [self.unit_config(backbone, method, mode, *u) for u in units]
        self.train_as_trials(f"{method} {mode}", cfg, configs)
        for unit, (shots, trial) in zip(configs, units):
            self.append(unit, method, mode, shots, trial)

    def append(self, cfg: Config, method: str, mode: str, shots: int, trial: int) -> None:
        rep = json.loads((Path(cfg.run.dir) / "analysis" / "ner.json").read_text())
        self.record({"kind": "ner", "method": method, "mode": mode, "n_shot": shots,
                     "seed": trial, "best_dev_f1": rep["best_dev_f1"],
                     "test_f1": rep["test_f1_at_best"], "best_step": rep["best_step"],
                     "train_sentences": rep["train_sentences"],
                     "curve": [[r["step"], r["dev_f1"], r["test_f1"]] for r in rep["curve"]],
                     "run": self.relative(cfg.run.dir)})


def write_corpus(ner_dir: str, path: Path, per_doc: int = 8) -> None:
    """The NER training sentences as plain text, documents of `per_doc` sentences."""
    from ..data.finetune.ner_sentences import read_split
    sents = [" ".join(s.tokens) for s in read_split(ner_dir, "train")]
    docs = ["\n".join(sents[i:i + per_doc]) for i in range(0, len(sents), per_doc)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n\n".join(docs) + "\n")
    tmp.replace(path)


def _timed(what: str, cfg: Config) -> dict:
    from ..tasks import train
    return trained(what, train, cfg)


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m jaxdepth.experiments.fusion_fewshot",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["run", "plan", "unit", "report", "all"])
    p.add_argument("name", nargs="?", help="unit: the unit's name, as `plan` lists it")
    p.add_argument("--out", required=True, help="experiment directory")
    p.add_argument("--ner-dir", help="WikiAnn or CoNLL-2003 directory (train, dev, test)")
    p.add_argument("--backbone", default="", help="HF BERT/RoBERTa directory or a run of this "
                   "project; empty: pretrain a small encoder on the NER sentences")
    p.add_argument("--preset", choices=sorted(PRESETS), default="paper")
    p.add_argument("--methods", nargs="+", choices=fusion_methods())
    p.add_argument("--modes", nargs="+", choices=tuple(FUSION_MODES))
    p.add_argument("--shots", nargs="+", type=int)
    p.add_argument("--trials", type=int)
    p.add_argument("--extra-layers", type=int, default=1)
    p.add_argument("--finetune", nargs="*", default=[], metavar="SECTION.FIELD=VALUE")
    p.add_argument("--pretrain", nargs="*", default=[], metavar="SECTION.FIELD=VALUE")
    add_executor_args(p)
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    return p.parse_args(argv)


def plan_from_args(args) -> Plan | None:
    if args.ner_dir is None:
        return None
    pre = PRESETS[args.preset]
    return Plan(ner_dir=args.ner_dir, backbone=args.backbone,
                methods=tuple(args.methods or fusion_methods()),
                modes=tuple(args.modes or FUSION_MODES),
                shots=tuple(args.shots or pre["shots"]), trials=args.trials or pre["trials"],
                extra_layers=args.extra_layers,
                finetune={**pre["finetune"], **overrides(args.finetune, "--finetune")},
                pretrain={} if args.backbone else
                {**pre["pretrain"], **overrides(args.pretrain, "--pretrain")})


def main(argv=None) -> int:
    return command_main(parse, _run, argv)


def _run(args) -> int:
    start_unit_process(args)  # before anything starts XLA
    plan = plan_from_args(args)
    if args.command in ("run", "all") and plan is None:
        raise ConfigError("--ner-dir: required to start or continue `run`")
    exp, executor = Experiment.from_args(args, plan)
    if not exp.common_command(args, executor):
        exp.report()
    return 0


if __name__ == "__main__":
    from ..errors import exit_process
    from ..trainer.runtime import tune_malloc

    tune_malloc()  # the process is ours, as train.py's and depth_sweep's (runtime.tune_malloc)
    exit_process(main())
