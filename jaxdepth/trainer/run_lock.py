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


class RunDirectoryInUse(UserError):
    """Another process trains in this run directory."""


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
            raise RunDirectoryInUse(
                f"{run_dir} is in use by {who} (lock {path}); wait for it to finish, or give "
                f"this run another --run.dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
