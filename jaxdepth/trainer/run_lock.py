"""One training process per run directory.

Two processes training into one directory would interleave metrics.jsonl, delete each
other's checkpoints and overwrite summary.json. The lock is an OS-level ``flock`` on
``<run>/.lock``: the kernel releases it when the process ends however it ends (``kill -9``
included), so a stale lock cannot outlive its holder; the file only records the holder's PID
for the message the next process prints.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import UserError

LOCK_FILE = ".lock"
# What the message tells the user to do instead of waiting: train.py's, and the experiments'
# (jaxdepth/experiments/), whose units' run directories lie under their --out.
RUN_DIR_ADVICE = "give this run another --run.dir"
OUT_ADVICE = "give this experiment another --out"


class RunDirectoryInUse(UserError):
    """Another process trains in this run directory. The message ends with what to do, in
    the words of the command the user ran (``advice``; ``advising``)."""

    def __init__(self, run_dir: Path, lock: Path, holder: str, advice: str = RUN_DIR_ADVICE):
        self.run_dir, self.lock, self.holder = run_dir, lock, holder
        super().__init__(f"{run_dir} is in use by {holder} (lock {lock}); wait for it to "
                         f"finish, or {advice}")


@contextmanager
def advising(advice: str) -> Iterator[None]:
    """A run directory in use inside the block is reported with `advice` instead of
    train.py's: a command that trains runs under a directory of its own (an experiment's
    --out) has no --run.dir to give."""
    try:
        yield
    except RunDirectoryInUse as e:
        raise RunDirectoryInUse(e.run_dir, e.lock, e.holder, advice).with_traceback(
            e.__traceback__) from None


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the duration of the block, or raise
    RunDirectoryInUse naming the holder's PID without changing anything in the directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    # Opened without truncating: while another process holds the lock, its PID stays readable.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            who = f"process {holder}" if holder.isdigit() else "another process"
            raise RunDirectoryInUse(run_dir, path, who) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
