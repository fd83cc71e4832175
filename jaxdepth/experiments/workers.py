"""An experiment's independent groups of units, trained N at a time in processes of their own.

`--workers N` starts each group of a stage (a depth's pretraining or fine-tuning on a task;
with --sequential one seed of it) as `python -m jaxdepth.experiments.depth_sweep run --out DIR
--group NAME`, at most N at once in the stage's order, its output in DIR/logs/NAME.log. Each
appends its own rows to DIR/results.jsonl (under a file lock). Workers get XLA's one-thread
flags (ONE_THREAD), which jax 0.10 follows for its Eigen ops but not for its matmuls: those
still use every core. So unpinned workers share the cores and compute what one process does,
but for the last bits of some Eigen ops; with `pin` each keeps to a core of its own, with one
core's rounding, which is what makes a second worker pay on a small CPU (docs/depth.md, the
measurements). A run resumes bit for bit only as it started, pinned or not.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..config import ConfigError
from ..errors import RunFailed

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# The core a pinned worker keeps to. XLA's CPU client sizes its thread pool by the cores the
# process may run on; with ONE_THREAD alone a worker's matmul loop ran at 180% CPU on 2 cores.
CPU_ENV = "JAXDEPTH_WORKER_CPU"


def pin_worker() -> None:
    """In a worker, before XLA starts: keep to the one core the parent gave it (the parent
    names one only where check_workers found sched_setaffinity)."""
    cpu = os.environ.get(CPU_ENV)
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})


def _cores(n: int) -> list[int]:
    """A core for each of n pinned workers (check_workers saw that there are n)."""
    return sorted(os.sched_getaffinity(0))[:n]


def check_workers(n: int, pin: bool = False) -> int:
    """n, if it is a number of CPU processes this machine can run (pinned if `pin`); else a
    ConfigError."""
    if n < 1:
        raise ConfigError(f"--workers: {n}; give at least 1")
    if pin and n < 2:
        raise ConfigError("--pin keeps each of --workers N's processes to a core; give "
                          "--workers 2 or more")
    if pin and not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--pin: this system cannot keep a process to a core "
                          "(no sched_setaffinity); leave --pin out")
    if pin and n > (cores := len(os.sched_getaffinity(0))):
        raise ConfigError(f"--workers {n} --pin: this process may use {cores} cores, so some "
                          "workers would share one; give at most that many workers")
    import jax

    if n > 1 and jax.default_backend() != "cpu":
        raise ConfigError(f"--workers {n}: the groups would share one {jax.default_backend()} "
                          "device; on an accelerator the seeds of a group already share it "
                          "as trials (leave --workers out)")
    return n


def _start(out: Path, name: str, flags: list[str], cpu: int | None
           ) -> tuple[subprocess.Popen, Path]:
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {ONE_THREAD}".strip()}
    env.pop(CPU_ENV, None)  # a worker started unpinned must not inherit a core
    if cpu is not None:
        env[CPU_ENV] = str(cpu)
    cmd = [sys.executable, "-m", "jaxdepth.experiments.depth_sweep", "run", "--out", str(out),
           "--group", name, *flags]
    with open(log, "a") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), log


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_groups(out: Path, names: list[str], n: int, pin: bool, flags: list[str]) -> None:
    """Run the named groups of one stage, n at a time (each on a core of its own if `pin`),
    each with the command-line `flags`; return when all are done. A group that fails lets the
    running ones finish, starts no other, and raises RunFailed naming it."""
    waiting, running, failed = list(names), {}, []
    free = _cores(n) if pin else [None] * n
    try:
        while waiting or running:
            while waiting and len(running) < n and not failed:
                name, cpu = waiting.pop(0), free.pop(0)
                running[name] = (*_start(out, name, flags, cpu), time.perf_counter(), cpu)
                print(f"{name}: started (log {running[name][1]})", flush=True)
            time.sleep(0.5)
            for name, (proc, log, t0, cpu) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                free.append(cpu)
                if proc.returncode:
                    failed.append(f"{name} (exit {proc.returncode}: {_last_line(log)}; log {log})")
                else:
                    print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
            if failed and not running:
                break
    finally:  # interrupted: each worker saves its step and stops (trainer/signals.py)
        for proc, *_ in running.values():
            proc.send_signal(signal.SIGTERM)
        for proc, *_ in running.values():
            proc.wait()
    if failed:
        raise RunFailed(f"{'; '.join(failed)}; run the command again to resume")
