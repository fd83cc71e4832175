"""An experiment: its directory (the plan file, written by the first command and checked by
every later one; one result file per finished unit of work, each written whole) and its
plan as data: the units, each one program (``Unit``: what it trains, which units it reads),
listed by ``plan``, run alone by ``unit NAME`` (by a scheduler, a worker or a user), or all
of them by an executor (experiments/executors.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, ClassVar, NamedTuple

from ..config import ConfigError
from ..errors import NotReady, RunFailed, run_main
from .executors import executor_from_args, local, per_group


class Unit(NamedTuple):
    """One program of an experiment's plan."""

    name: str  # what `unit NAME` runs, and the file names its run takes
    trains: str  # what it trains (or computes), in words
    after: tuple[str, ...]  # the units whose outputs it reads: it runs once they are done
    run: Callable[[], None]
    done: Callable[[], bool]  # whether every output it makes is there
    analysis: bool = False  # an analysis of the trained units (not run by `run`)
    results: tuple[str, ...] = ()  # the names of the results it writes


class PlanData:
    """A plan dataclass as its experiment's plan file holds it: its fields, lists read back
    as tuples."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict):
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def nested(flat: dict) -> dict:
    """{"section.field": value} as {section: {field: value}} (apply_overrides's form)."""
    out: dict = {}
    for key, value in flat.items():
        sec, _, name = key.partition(".")
        out.setdefault(sec, {})[name] = value
    return out


def overrides(items: list[str], flag: str) -> dict:
    """SECTION.FIELD=VALUE flags as {"section.field": value}, each field checked."""
    from ..config.cli import _parse_value
    from ..config import SECTIONS

    out = {}
    for item in items:
        key, eq, raw = item.partition("=")
        sec, _, name = key.partition(".")
        if not eq or sec not in SECTIONS \
                or name not in {f.name for f in dataclasses.fields(SECTIONS[sec])}:
            raise ConfigError(f"{flag} {item!r}: expected section.field=value with a known field")
        out[key] = _parse_value(sec, name, raw)
    return out


def command_main(parse, run, argv=None) -> int:
    """An experiment's command: run(args) of the parsed argv, a user's error in one line (exit
    2), a unit's run in use named as another experiment on this --out."""
    from ..trainer.run_lock import OUT_ADVICE, advising

    args = parse(sys.argv[1:] if argv is None else argv)

    def advised() -> int:
        with advising(OUT_ADVICE):
            return run(args)
    return run_main(advised, debug=args.debug)


def trained(what: str, train, *args) -> dict:
    """train(*args)'s summary, its start and time in the log; RunFailed when the run stopped
    before its end."""
    t0 = time.perf_counter()
    print(f"{what} ...", flush=True)
    out = train(*args)
    if not out.get("done"):
        raise RunFailed(f"{what} stopped at step {out['step']} before the end; "
                        f"run the command again to resume")
    print(f"{what}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def start_unit_process(args) -> None:
    """Before anything starts XLA: the process of `unit` may be a worker of a local pool (its
    flags and core: workers.as_worker) or one of the processes a scheduler started to run
    the unit together (--processes auto: they join through jax.distributed)."""
    if args.command != "unit":
        if args.processes != "1":
            raise ConfigError(f"--processes {args.processes}: only `unit` runs across "
                              f"processes; an executor starts each unit's")
        return
    from .workers import as_worker

    as_worker()
    if args.processes == "auto":
        from ..config.mesh import AUTO, MeshConfig
        from ..trainer.processes import start

        start(MeshConfig(num_processes=AUTO))


@contextlib.contextmanager
def shared_compilations(directory: Path):
    """JAX's persistent compilation cache in `directory` while units run: the units of an
    experiment compile a few programs many times (every seed of a depth and task the same
    step), so every compile after the first is a load; units on a cluster share the one cache
    in the experiment's directory. The settings before come back afterwards."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {n: getattr(jax.config, n) for n in names}
    for n, v in zip(names, (str(directory), 0.0, 0)):  # every program, however small
        jax.config.update(n, v)
    cc.reset_cache()
    try:
        yield
    finally:
        for n, v in before.items():
            jax.config.update(n, v)
        cc.reset_cache()


def _commit() -> str | None:
    """The git commit of the package's source tree, with "+dirty" when tracked files differ
    from it; None outside a git checkout (an installed wheel)."""
    src = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True,
                              text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "."], cwd=src, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict:
    """What a unit's numbers depend on beyond its config: the code, jax, the device, and the
    threads and core it ran on (the last bits differ between thread counts and cores)."""
    import jax
    import jaxlib

    from .workers import CPU_ENV

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = len(affinity) if affinity is not None else os.cpu_count()
    # the core a unit kept to (workers.as_worker), as the process sees it
    pinned = (min(affinity) if os.environ.get(CPU_ENV) is not None and affinity
              and len(affinity) == 1 else None)
    return {"commit": _commit(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
            "device_count": jax.device_count(), "cpu": _cpu_model(),
            "cores": cores, "pinned_cpu": pinned,
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


class PlannedExperiment:
    """An experiment directory: its plan (``PLAN_FILE``, a ``PLAN``), its units in the order
    an executor starts them (``schedule()``) and their results (``results/<name>.json``, each
    written whole with the run's provenance; an earlier version's ``results.jsonl`` read as it
    is), each named by ``result_name(row)``."""

    PLAN: ClassVar[type]  # each experiment names its plan dataclass
    PLAN_FILE: ClassVar[str] = "plan.json"
    MODULE: ClassVar[str]  # the experiment's command: python -m MODULE unit NAME --out DIR
    # How many seeds (or trials) train side by side as one program; None: every one a unit
    # can hold. 1 (--sequential): one program per seed.
    per_group: int | None = None

    def __init__(self, out: Path, plan):
        self.out, self.plan = out, plan
        self.results = out / "results"
        self.compile_cache = out / "jax_cache"  # every unit's (shared_compilations)
        self.units_run = 0  # trained by this process (a rerun of a finished one trains none)
        self._legacy: set[str] | None = None  # the results of results.jsonl, once read

    # ------------------------------------------------------------------ the units

    def grouping(self) -> list[str]:
        """The command-line flags that name the units as this process does."""
        return [] if self.per_group is None else ["--seeds-per-group", str(self.per_group)]

    def unit_command(self, name: str) -> list[str]:
        return [sys.executable, "-m", self.MODULE, "unit", name, "--out", str(self.out),
                *self.grouping()]

    def plan_data(self) -> dict:
        """Every unit as data (``plan``): its name, what it trains, the units it reads, what
        it needs (one device: a CPU core or an accelerator), whether it is done, and the
        command that runs it."""
        return {"experiment": self.MODULE.rsplit(".", 1)[-1], "out": str(self.out),
                "grouping": self.grouping(),
                "units": [{"name": u.name, "trains": u.trains, "after": list(u.after),
                           "analysis": u.analysis, "resources": {"devices": 1},
                           "done": u.done(), "command": self.unit_command(u.name)}
                          for u in self.schedule()]}

    def all_done(self, results: tuple[str, ...]) -> Callable[[], bool]:
        """A unit's `done`: whether every one of `results` is there."""
        return lambda: set(results) <= self.finished()

    def run_unit(self, name: str) -> None:
        """Unit `name` alone: a ConfigError for a name the plan does not have; NotReady (exit
        75: a scheduler may retry) while a unit it reads is not done."""
        units = {u.name: u for u in self.schedule()}
        if name not in units:
            grouped = " ".join(self.grouping()) or "each unit a whole group of seeds"
            raise ConfigError(f"unit {name}: not a unit of this plan ({grouped}); its units: "
                              f"{', '.join(units)}", field="unit")
        waiting = [a for a in units[name].after if not units[a].done()]
        if waiting:
            raise NotReady(f"unit {name} reads {', '.join(waiting)}, not done yet; run it once "
                           f"they are")
        with shared_compilations(self.compile_cache):
            units[name].run()

    def run(self, executor=None, analysis: bool = False) -> None:
        """Every unit not done yet (and the analyses if `analysis`), through `executor`
        (experiments/executors.py; default: here, one after another), each once the units it
        reads are done; then a line if there was nothing to train."""
        executor = executor or local()
        self.set_aside()
        ran, rows = self.units_run, len(self.rows())
        units = [u for u in self.schedule() if analysis or not u.analysis]
        todo = [u for u in units if u.analysis or not u.done()]
        with shared_compilations(self.compile_cache):  # the units run here, if any
            executor(self, todo)
        if self.units_run == ran and len(self.rows()) == rows and not any(
                u.analysis for u in todo):
            print(f"all {len(units)} units of {self.out} are done (results/); nothing to run",
                  flush=True)

    def train_as_trials(self, what: str, cfg, units: list) -> list[dict]:
        """Train cfg, a run with trials, whose trial k must be exactly the solo run units[k]
        (a Config; else a ConfigError saying to give --sequential); export every trial to its
        unit's run directory (trainer/trials.py: export_trial) and return each trial's
        summary as its solo run's would read (the run's figures with the trial's entry over
        them)."""
        from ..config.trials import trial_configs
        from ..tasks import task_for
        from ..trainer.loop import train
        from ..trainer.trials import export_trial

        cfgs = trial_configs(cfg)
        for k, (c, unit) in enumerate(zip(cfgs, units)):
            if dataclasses.replace(c, run=dataclasses.replace(c.run, dir=unit.run.dir)) != unit:
                raise ConfigError(f"{what}: trial {k} would differ from its unit's run "
                                  f"({unit.run.dir}); give --sequential")
        self.units_run += len(units)
        s = trained(f"{what}: {len(units)} units as trials of one program", train, cfg,
                    [task_for(c) for c in cfgs])
        out = []
        for k, unit in enumerate(units):
            export_trial(cfg.run.dir, k, task_for, unit.run.dir)
            out.append({**s, **{n: v for n, v in s["trials"][k].items() if n != "trial"}})
        return out

    # ------------------------------------------------------------------ results

    def record(self, row: dict) -> None:
        """Write a finished run's result, `row` with its provenance, as
        results/<result_name(row)>.json."""
        import jax

        from ..files import write_whole

        if jax.process_index() != 0:  # a unit run across processes: one record, process 0's
            return
        self.results.mkdir(parents=True, exist_ok=True)
        write_whole(self.results / f"{self.result_name(row)}.json",
                    json.dumps({**row, "provenance": provenance()}, indent=1) + "\n")

    def relative(self, run_dir) -> str:
        """A run directory as its row records it: relative to the experiment's, so
        that rows stay true when the directory moves (or are kept elsewhere, as the docs'
        per-seed rows are)."""
        return Path(run_dir).relative_to(self.out).as_posix()

    def set_aside(self) -> None:
        """Before a run: every damaged result record moved aside, bytes kept, so that its unit
        runs again and no record is read together with it (analysis.results)."""
        from ..analysis.results import set_aside_unreadable
        from ..errors import warn

        for where, aside in set_aside_unreadable(self.out):
            warn(f"{where}: not a whole result record (a write cut short?); moved to {aside}, "
                 f"and its unit runs again")
        self._legacy = None

    def finished(self) -> set[str]:
        """The names of the results there are (results/*.json, and the rows of an earlier
        version's results.jsonl), without reading the files."""
        from ..analysis.results import LEGACY_RESULTS, load_rows

        if self._legacy is None:
            legacy = self.out / LEGACY_RESULTS
            self._legacy = ({self.result_name(r) for r in load_rows(legacy)}
                            if legacy.is_file() else set())
        return {p.stem for p in self.results.glob("*.json")} | self._legacy

    def rows(self) -> list[dict]:
        """Every finished unit's row; of a unit found twice (a results.jsonl of an earlier
        version holds a row per start of a resumed unit), the later row."""
        from ..analysis.results import load_rows

        latest = {self.result_name(r): r
                  for r in (load_rows(self.out) if self.out.is_dir() else [])}
        return list(latest.values())

    @classmethod
    def open(cls, out: Path, plan, check=None):
        """The experiment in `out`, its plan saved there by the first command (`plan`; a later
        command's, if given, must equal it: another is refused naming the fields that differ);
        `check(experiment)` runs before anything is written, so that its refusal leaves no
        trace."""
        path = out / cls.PLAN_FILE
        saved = path.is_file()
        if saved:
            first = cls.PLAN.from_json(json.loads(path.read_text()))
            if plan is not None and plan != first:
                diff = [k for k, v in plan.to_json().items() if first.to_json()[k] != v]
                raise ConfigError(f"{diff[0]}: {out} holds an experiment with another plan "
                                  f"(differs in {', '.join(diff)}); use another --out")
            plan = first
        elif plan is None:
            raise FileNotFoundError(f"no experiment in {out} (expected {path}); start it with "
                                    f"`run`")
        exp = cls(out, plan)
        if check is not None:
            check(exp)
        if not saved:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(plan.to_json(), indent=2))
        return exp

    @classmethod
    def from_args(cls, args, plan):
        """(the experiment in --out, the executor its flags ask for), every flag checked before
        anything is written: a unit's name given only to `unit` and one of the plan, a
        grouping the plan can take."""
        if (args.command == "unit") != bool(args.name):
            raise ConfigError("unit NAME: give the unit's name (and only to `unit`)")
        executor = executor_from_args(args)

        def check(exp) -> None:
            if (g := per_group(args)) is not None:  # else the class's
                exp.per_group = g
            names = [u.name for u in exp.schedule()]  # refuses a grouping the plan cannot take
            if args.command == "unit" and args.name not in names:
                exp.run_unit(args.name)  # the one-line refusal
        return cls.open(Path(args.out), plan, check), executor

    def common_command(self, args, executor) -> bool:
        """The commands every experiment has: `plan`, `unit NAME`, `run` and `all`; False for
        another."""
        if args.command == "plan":
            print(json.dumps(self.plan_data(), indent=1))
        elif args.command == "unit":
            self.run_unit(args.name)
        elif args.command in ("run", "all"):
            self.run(executor, analysis=args.command == "all")
        else:
            return False
        return True
