"""An experiment's units, trained N at a time in processes of their own.

The local executor's pool (executors.py): `--workers N` starts each unit of the plan (a
depth's pretraining or fine-tuning on a task of a group of seeds) as its experiment's
`unit NAME` command, at most N at once, each once the units it reads are done (a fine-tuning
after its pretraining), its output in DIR/logs/NAME.log. A worker stops with a save when its
parent dies, and the parent forwards SIGTERM and SIGINT to its workers (_Forward); the
workers stay in the parent's process group, so a terminal's Ctrl-C or `kill -STOP` reaches
them all. Workers get XLA's one-thread flags (ONE_THREAD), which jax follows for its Eigen
ops but not for its matmuls: unpinned workers share the cores and compute what one process
does, but for the last bits of some Eigen ops; with `pin` each keeps to a core of its own,
with one core's rounding. A run resumes bit for bit only as it started, pinned or not.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..config import ConfigError
from ..errors import Interrupted, RunFailed

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# The core a pinned worker keeps to (XLA's CPU client sizes its thread pool by the cores the
# process may run on).
CPU_ENV = "JAXDEPTH_WORKER_CPU"
# The parent's pid: a worker stops when it is gone (as_worker).
PARENT_ENV = "JAXDEPTH_WORKER_PARENT"
# CPU_ENV's value where no parent hands out cores (a Ray task): a core of this machine that no
# other unit holds, claimed by the unit's process itself (a lock file per core).
FREE_CORE = "free"
_claimed: list[int] = []  # the lock's descriptor, held while the process lives


def _claim_core() -> int | None:
    """The first core of this process's affinity that no other unit of this machine holds
    (its lock, in the temporary directory, is released when the process ends however it
    ends); None, with a warning, when every one is held."""
    import fcntl
    import tempfile

    from ..errors import warn

    for cpu in sorted(os.sched_getaffinity(0)):
        fd = os.open(os.path.join(tempfile.gettempdir(), f"jaxdepth-core-{cpu}.lock"),
                     os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _claimed.append(fd)
        return cpu
    warn("--pin: every core of this machine is held by another unit; this one runs unpinned")
    return None


def as_worker() -> None:
    """In a worker, before XLA starts: keep to the one core the parent gave it (the parent
    names one only where check_workers found sched_setaffinity), and stop as on SIGTERM (a
    save and exit 3 while training) when the parent dies, however it dies: a worker left
    training unsupervised would hold its unit's lock against the rerun."""
    cpu = os.environ.get(CPU_ENV)
    if cpu == FREE_CORE:
        cpu = _claim_core()
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})
    parent = os.environ.get(PARENT_ENV)
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True,
                         name="parent-watch").start()


def _watch_parent(parent: int) -> None:
    """SIGTERM to this process, once, when its parent is gone (it is then re-parented).
    A watch rather than Linux's parent-death signal, which comes once per thread of a
    multi-threaded parent as they die (jax's parent has many), a second SIGTERM that would
    stop the worker without its save."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def _cores(n: int) -> list[int]:
    """A core for each of n pinned workers (check_workers saw that there are n)."""
    return sorted(os.sched_getaffinity(0))[:n]


def check_workers(n: int, pin: bool = False) -> None:
    """A ConfigError unless n is a number of CPU processes this machine can run (pinned if
    `pin`)."""
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


def worker_env(cpu: int | str | None, parent: int | None = None) -> dict:
    """A unit's process environment: XLA's one-thread flags, the core it keeps to (none:
    unpinned, never a core inherited), and the parent it stops with."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {ONE_THREAD}".strip()}
    env.pop(CPU_ENV, None)
    env.pop(PARENT_ENV, None)
    if cpu is not None:
        env[CPU_ENV] = str(cpu)
    if parent is not None:
        env[PARENT_ENV] = str(parent)
    return env


def _start(out: Path, name: str, command: list[str], cpu: int | None
           ) -> tuple[subprocess.Popen, Path]:
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        return subprocess.Popen(command, env=worker_env(cpu, os.getpid()), stdout=f,
                                stderr=subprocess.STDOUT), log


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


class _Forward:
    """SIGTERM and SIGINT to the parent while its workers run: the first stops every running
    worker as that signal would stop a run (SIGTERM to each: it saves its step and exits 3)
    and starts no other; the same signal again stops them at once, without saving. The
    workers stay in the parent's process group, so a Ctrl-C in the terminal reaches them
    directly too, and `kill -STOP -- -PGID` pauses the whole sweep."""

    def __init__(self, running: dict) -> None:
        self.running, self.signum, self.again = running, 0, False
        self._previous: dict = {}

    def __enter__(self) -> "_Forward":
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not self.signum:
            self.signum = signum
            print(f"{name}: stopping the running units {', '.join(self.running) or '(none)'} "
                  f"after their current step, once each has saved it (send it again to stop "
                  f"them at once, without saving)", file=sys.stderr, flush=True)
        elif signum == self.signum and not self.again:
            self.again = True
            print(f"{name} again: stopping the running units at once, without saving",
                  file=sys.stderr, flush=True)
        else:
            return
        for proc, *_ in self.running.values():
            proc.send_signal(signal.SIGTERM)


_STOPPED = re.compile(r"^stopped at step (\d+) by SIG\w+: checkpoint of step \d+ saved")


def _how_it_stopped(proc: subprocess.Popen, log: Path) -> str:
    """A worker stopped by a signal the parent forwarded, in a few words."""
    code = proc.returncode
    if code == 0:
        return "finished"
    if code == 3:
        last = next((m for line in reversed(log.read_text(errors="replace").splitlines())
                     if (m := _STOPPED.match(line))), None)
        return f"step {last.group(1)} saved" if last else "stopped, its step saved"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}, nothing in progress saved"
    return f"exit {code}: {_last_line(log)}"


def run_groups(out: Path, groups: list[tuple[str, tuple[str, ...]]], n: int, pin: bool,
               command: Callable[[str], list[str]]) -> None:
    """Run the named units, each after the units it names (every one of them in `groups`),
    n at a time (each on a core of its own if `pin`), each by its command(name), the first
    ready one in list order next; return when all are done. A group that fails lets
    the running ones finish, starts no other, and raises RunFailed naming it. SIGTERM or
    SIGINT stops the running ones, each with a save (_Forward), and raises Interrupted naming
    them."""
    waiting, running, finished, failed, stopped = list(groups), {}, set(), [], []
    free = _cores(n) if pin else [None] * n
    with _Forward(running) as stop:
        try:
            while waiting or running:
                while len(running) < n and not failed and not stop.signum:
                    ready = next((g for g in waiting if set(g[1]) <= finished), None)
                    if ready is None:
                        break
                    waiting.remove(ready)
                    name, cpu = ready[0], free.pop(0)
                    running[name] = (*_start(out, name, command(name), cpu),
                                     time.perf_counter(), cpu)
                    print(f"{name}: started (log {running[name][1]})", flush=True)
                time.sleep(0.5)
                for name, (proc, log, t0, cpu) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    del running[name]
                    free.append(cpu)
                    if stop.signum:
                        stopped.append(f"{name} ({_how_it_stopped(proc, log)})")
                    elif proc.returncode:
                        failed.append(f"{name} (exit {proc.returncode}: {_last_line(log)}; "
                                      f"log {log})")
                    else:
                        finished.add(name)
                        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
                if (failed or stop.signum) and not running:
                    break
        finally:  # an error of the parent's own: each worker saves its step and stops
            for proc, *_ in running.values():
                proc.send_signal(signal.SIGTERM)
            for proc, *_ in running.values():
                proc.wait()
    if stop.again:  # as a run stopped twice: the process dies by the signal
        signal.signal(stop.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stop.signum)
    if stop.signum:
        raise Interrupted(f"stopped by {signal.Signals(stop.signum).name}: "
                          f"{'; '.join(stopped) or 'no unit was running'}; rerun the same "
                          f"command to resume")
    if failed:
        raise RunFailed(f"{'; '.join(failed)}; run the command again to resume")
