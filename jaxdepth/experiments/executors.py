"""How an experiment's units run (``--executor``). Each unit is one program: the experiment's
``unit NAME`` command (PlannedExperiment.unit_command), started once the units it reads are
done, and idempotent (a finished unit does nothing; an interrupted one resumes from its
checkpoints), so that any engine may retry it.

- ``local`` (the default, no dependency): in this process one after another, or with
  ``--workers N`` a pool of N worker processes on this machine (workers.py; CPU only).
- ``ray``: each unit a Ray task (``--ray-address`` joins a running cluster, else a local one
  starts), which runs the unit's command in a fresh process with the same XLA flags and, with
  ``--pin``, a core of its own; a failed or preempted unit is retried and resumes.
- ``slurm``: through submitit, an array job per stage of the plan (the units whose inputs
  the stage before makes), each stage after the one before (``--dependency=afterok``).

Ray and submitit are optional (``pip install jaxdepth[cluster]``), imported only when chosen.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable

from ..config import ConfigError

EXECUTORS = ("local", "ray", "slurm")


def add_executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds-per-group", type=int, default=None, metavar="G",
                   help="train G seeds as the trials of one program (a unit), the last group "
                        "the rest (default: every seed of a depth, task and start in one)")
    p.add_argument("--sequential", action="store_true",
                   help="one program per seed: --seeds-per-group 1")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="what runs the units: this machine (local), a Ray cluster (ray), "
                        "a SLURM cluster through submitit (slurm)")
    p.add_argument("--workers", type=int, default=1,
                   help="local, CPU only: run this many units at once, each in its own process; "
                        "logs in OUT/logs/ (default 1: this process)")
    p.add_argument("--pin", action="store_true",
                   help="local --workers or ray: keep each unit's process to a core of its own "
                        "(Linux); faster on a small CPU, and one core's rounding: another draw "
                        "of the same runs than one process gives")
    p.add_argument("--ray-address", default=None,
                   help="ray: the cluster to join (default: start a local one)")
    p.add_argument("--retries", type=int, default=2,
                   help="ray: times a failed or preempted unit is run again (it resumes)")
    p.add_argument("--slurm-folder", default=None,
                   help="slurm: submitit's folder for job scripts and logs (default: "
                        "OUT/slurm)")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="slurm: a submitit parameter (slurm_partition=gpu, timeout_min=600, "
                        "gpus_per_node=1, ...)")


def per_group(args) -> int | None:
    """--seeds-per-group, with --sequential as its name for 1."""
    if args.sequential and args.seeds_per_group not in (None, 1):
        raise ConfigError(f"--sequential is --seeds-per-group 1; it contradicts "
                          f"--seeds-per-group {args.seeds_per_group}")
    if args.seeds_per_group is not None and args.seeds_per_group < 1:
        raise ConfigError(f"--seeds-per-group: {args.seeds_per_group}; give at least 1")
    return 1 if args.sequential else args.seeds_per_group


def executor_from_args(args) -> Callable:
    """The executor the flags ask for, its flags checked (a ConfigError naming the first
    wrong one) before anything is written."""
    if args.executor != "local" and args.workers != 1:
        raise ConfigError(f"--workers: the local executor's; the {args.executor} executor "
                          f"runs as many units at once as its cluster has room for")
    if args.executor == "local":
        if args.workers != 1 or args.pin:
            from .workers import check_workers
            check_workers(args.workers, args.pin)
        return local(args.workers, args.pin)
    if args.executor == "ray":
        return ray(args.ray_address, args.retries, args.pin)
    return slurm(args.slurm_folder, dict(_key_value(x) for x in args.slurm))


def _key_value(item: str) -> tuple[str, object]:
    key, eq, raw = item.partition("=")
    if not eq or not key:
        raise ConfigError(f"--slurm {item!r}: expected KEY=VALUE (a submitit parameter)")
    for cast in (int, float):
        try:
            return key, cast(raw)
        except ValueError:
            pass
    return key, raw


def _ready_order(units) -> list[list]:
    """The units as stages: each stage's units read only units of the stages before (or
    units already done, which are not among them)."""
    names, placed, stages = {u.name for u in units}, set(), []
    left = list(units)
    while left:
        stage = [u for u in left if all(a in placed or a not in names for a in u.after)]
        if not stage:
            raise ValueError(f"the units {[u.name for u in left]} wait on each other")
        stages.append(stage)
        placed |= {u.name for u in stage}
        left = [u for u in left if u.name not in placed]
    return stages


def local(workers: int = 1, pin: bool = False) -> Callable:
    def run(exp, units) -> None:
        if workers == 1:
            for u in units:  # the schedule's order has every unit after those it reads
                u.run()
            return
        from .workers import run_groups
        names = {u.name for u in units}
        run_groups(exp.out, [(u.name, tuple(a for a in u.after if a in names)) for u in units],
                   workers, pin, exp.unit_command)
    return run


def ray(address: str | None, retries: int, pin: bool) -> Callable:
    try:
        import ray as ray_lib  # noqa: F401  (the optional extra: refused now, not mid-run)
    except ImportError:
        raise ConfigError("--executor ray: Ray is not installed; pip install "
                          "'jaxdepth[cluster]' (or ray)") from None
    from .ray_units import run_on_ray

    def run(exp, units) -> None:
        run_on_ray(exp, _ready_order(units), address, retries, pin)
    return run


def slurm(folder: str | None, params: dict) -> Callable:
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ConfigError("--executor slurm: submitit is not installed; pip install "
                          "'jaxdepth[cluster]' (or submitit)") from None
    from .slurm_units import run_on_slurm

    def run(exp, units) -> None:
        run_on_slurm(exp, _ready_order(units), folder or os.path.join(exp.out, "slurm"), params)
    return run
