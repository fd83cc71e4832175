"""How an experiment's units run (``--executor``). Each unit is one program: the experiment's
``unit NAME`` command (PlannedExperiment.unit_command), started once the units it reads are
done, and idempotent (a finished unit does nothing; an interrupted one resumes from its
checkpoints), so that any engine may retry it.

- ``local`` (the default, no dependency): in this process one after another, or with
  ``--workers N`` a pool of N worker processes on this machine (workers.py; CPU only).
- ``ray``: each unit a Ray task (``--ray-address`` joins a running cluster, else a local one
  starts), which runs the unit's command in a fresh process with the same XLA flags and, with
  ``--pin``, a core of its own, or with ``--gpus-per-unit N`` N GPUs of its own; a failed or
  preempted unit is retried and resumes.
- ``slurm``: through submitit, an array job per stage of the plan (the units whose inputs
  the stage before makes), each stage after the one before (``--dependency=afterok``).

Ray and submitit are optional (``pip install jaxdepth[cluster]``), imported only when chosen.
"""
from __future__ import annotations

import argparse
import importlib
import os
from typing import Callable

from ..config import ConfigError

def add_executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds-per-group", type=int, default=None, metavar="G",
                   help="train G seeds as the trials of one program (a unit), the last group "
                        "the rest (default: every seed of a depth, task and start in one)")
    p.add_argument("--sequential", action="store_true",
                   help="one program per seed: --seeds-per-group 1")
    p.add_argument("--executor", choices=("local", "ray", "slurm"), default="local",
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
    p.add_argument("--gpus-per-unit", type=int, default=0, metavar="N",
                   help="ray: the GPUs each unit's task asks for; its process sees only those "
                        "(Ray sets CUDA_VISIBLE_DEVICES), and the unit's trials and rows spread "
                        "over them (default 0: a CPU core each). slurm: --slurm gpus_per_node=N")
    p.add_argument("--retries", type=int, default=2,
                   help="ray: times a failed or preempted unit is run again (it resumes)")
    p.add_argument("--slurm-folder", default=None,
                   help="slurm: submitit's folder for job scripts and logs (default: "
                        "OUT/slurm)")
    p.add_argument("--processes", choices=("1", "auto"), default="1",
                   help="unit: run it across the processes a scheduler started for it (srun, "
                        "a TPU slice, mpirun), which find each other through "
                        "jax.distributed (docs/cluster.md); default 1: this process alone")
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
    if args.gpus_per_unit and args.executor != "ray":
        raise ConfigError("--gpus-per-unit: the ray executor's; "
                          + ("the local executor runs units on this machine's devices"
                             if args.executor == "local" else
                             f"give the slurm executor --slurm gpus_per_node={args.gpus_per_unit}"))
    if args.gpus_per_unit < 0:
        raise ConfigError(f"--gpus-per-unit {args.gpus_per_unit}: give 0 or more")
    if args.executor == "local":
        if args.workers != 1 or args.pin:
            from .workers import check_workers
            check_workers(args.workers, args.pin)
        return local(args.workers, args.pin)
    if args.executor == "ray":
        return ray(args.ray_address, args.retries, args.pin, args.gpus_per_unit)
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


class UnitFailed(RuntimeError):
    """A unit's command exited with an error (an engine may retry it: it resumes)."""


def run_command(command: list[str], env: dict, log: str) -> str:
    """A unit's command in a process of its own, its output appended to `log`; raises
    UnitFailed naming the unit, its exit and its last line when it does not exit 0. Run
    inside a Ray task or a SLURM job (picklable: a module-level function)."""
    import subprocess

    from .workers import _last_line

    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as f:
        if env.get("CUDA_VISIBLE_DEVICES"):  # the GPUs an engine gave it (Ray's num_gpus)
            print(f"{command[4]}: GPUs {env['CUDA_VISIBLE_DEVICES']}", file=f, flush=True)
        rc = subprocess.run(command, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        from pathlib import Path
        raise UnitFailed(f"{command[4]} (exit {rc}: {_last_line(Path(log))}; log {log})")
    return command[4]


def _cluster_module(executor: str, module: str, name: str):
    """The optional module an executor runs on; a ConfigError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"--executor {executor}: {name} is not installed; pip install "
                          f"'jaxdepth[cluster]' (or {module})") from None


def ray(address: str | None, retries: int, pin: bool, gpus: int = 0) -> Callable:
    ray_lib = _cluster_module("ray", "ray", "Ray")

    def run(exp, units) -> None:
        from ..errors import RunFailed
        from .workers import FREE_CORE, worker_env

        started = not ray_lib.is_initialized()
        if started:  # a cluster to join, or a local one of this machine's cores
            ray_lib.init(address=address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")
        try:
            @ray_lib.remote(num_cpus=1, num_gpus=gpus, max_retries=retries,
                            retry_exceptions=True)
            def unit(command, log, *after):  # `after`: its inputs' refs, so it waits for them
                # the same XLA flags as a local worker, a free core of its node if pinned,
                # stopping when the Ray worker that started it dies; the GPUs Ray gave the
                # task in CUDA_VISIBLE_DEVICES (the environment the command inherits)
                return run_command(command, worker_env(FREE_CORE if pin else None, os.getpid()),
                                   log)

            refs: dict = {}
            for u in units:  # in schedule order: a unit's inputs were submitted before it
                log = os.path.join(exp.out, "logs", f"{u.name}.log")
                refs[u.name] = unit.remote(exp.unit_command(u.name), log,
                                           *(refs[a] for a in u.after if a in refs))
            failed = []
            for name, ref in refs.items():
                try:
                    ray_lib.get(ref)
                    print(f"{name}: done", flush=True)
                except Exception as e:  # after its retries
                    failed.append(str(getattr(e, "cause", None) or e).splitlines()[-1])
            if failed:
                raise RunFailed(f"{'; '.join(failed)}; run the command again to resume")
        finally:
            if started:
                ray_lib.shutdown()
    return run


def slurm(folder: str | None, params: dict) -> Callable:
    submitit = _cluster_module("slurm", "submitit", "submitit")

    def run(exp, units) -> None:
        from ..errors import RunFailed, one_line

        ex = submitit.AutoExecutor(folder=folder or os.path.join(exp.out, "slurm"))
        ex.update_parameters(**params)
        jobs, before = [], []  # (unit, job)
        for stage in _ready_order(units):
            if before and ex.cluster == "slurm":  # the queue holds it until they succeed
                ex.update_parameters(slurm_additional_parameters={
                    "dependency": f"afterok:{before[0].job_id.split('_')[0]}"})
            elif before:  # a local or debug "cluster" has no queue: wait here
                for j in before:
                    j.result()
            logs = [os.path.join(exp.out, "logs", f"{u.name}.log") for u in stage]
            commands = [exp.unit_command(u.name) for u in stage]
            before = ex.map_array(run_command, commands, [dict(os.environ)] * len(stage), logs)
            print(f"submitted {', '.join(u.name for u in stage)} as job "
                  f"{before[0].job_id.split('_')[0]}", flush=True)
            jobs += zip(stage, before)
        failed = []
        for u, j in jobs:
            try:
                print(f"{j.result()}: done", flush=True)
            except Exception as e:  # submitit's error: the job's trace between dashed lines
                trace = [line for line in str(e).split("-" * 22)[1].splitlines()
                         if line.strip()] if str(e).count("-" * 22) >= 2 else []
                why = trace[-1].split("UnitFailed: ")[-1] if trace else one_line(e)
                failed.append(why if why.startswith(u.name) else
                              f"{u.name} (job {j.job_id}: {why})")
        if failed:
            raise RunFailed(f"{'; '.join(failed)}; run the command again to resume")
    return run
