"""What a user sees when a run cannot go on: the error types, and the one boundary that
train.py and eval.py put around their work (``run_main``).

An error is the user's when their config, their files or their disk caused it (a bad value, a
malformed, unreadable or missing file, a full or read-only disk, a run directory in use): one
line, ``error: <message>``, naming the file (and the line where there is one), exit code 2;
``--debug`` adds the traceback. A run that stopped for a reason of its own (a non-finite loss)
is one line and exit code 1. Anything else is a bug and raises with its traceback. Exit codes:
0 done (or stopped by ``run.stop_after``), 1, 2, 75 an experiment's unit whose inputs are not
there yet (``NotReady``), 3 training stopped by SIGTERM or SIGINT after saving a checkpoint of
its step (``Interrupted``): rerunning resumes. A code of its own, so that a job script tells
it from a process the signal killed before it could save (128 + signal number, 143 or 130).
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 1
EXIT_INTERRUPTED = 3
EXIT_NOT_READY = 75  # EX_TEMPFAIL: what it needs is not there yet; a scheduler may retry


class UserError(Exception):
    """Caused by the user's config, files or disk; the message names the setting or file and
    says what to do."""

    label = "error"  # what the boundary's line starts with


class ConfigError(UserError, ValueError):
    """An impossible or inconsistent configuration; the message names the field (also kept
    as ``field``, so a config file's reader can point at its line). Defined here rather than
    in config.py so that the choices config.py validates against (jaxdepth/optim.py) can raise
    it without importing the schema."""

    label = "config error"

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class DataError(UserError, ValueError):
    """An input file that cannot be used (malformed, empty, not UTF-8, truncated): the message
    names the file, and the line where there is one. A ValueError too, so callers that catch
    the readers' ValueErrors keep working."""


class NotReady(UserError):
    """An experiment's unit asked to run before the units it reads are done: exit
    EXIT_NOT_READY, which a scheduler tells from a user's error (2) and may retry."""

    label = "not ready"


class RunFailed(Exception):
    """Training stopped for a reason that is neither a bug nor bad input (a non-finite loss);
    the message says what was kept."""


class Interrupted(Exception):
    """Training stopped on SIGTERM or SIGINT, after saving a checkpoint of the step it stopped
    at; the message (the whole line the boundary prints) says so."""


class ResultNotWritten(UserError):
    """A result was computed but its file could not be written: the boundary prints the result
    (``result``, JSON) before this error's line."""

    def __init__(self, result: dict, path, error: OSError) -> None:
        self.result = result
        super().__init__(f"could not write the result to {path} "
                         f"({os_error_reason(error) or describe(error)}); it is "
                         f"printed above; give --out a writable path to keep it in a file")


@contextmanager
def writing_result(result: dict, path) -> Iterator[None]:
    """Writing `result` to `path` (a file or a directory of files): a failed write raises
    ResultNotWritten, which carries the result."""
    try:
        yield
    except OSError as e:
        raise ResultNotWritten(result, path, e) from e


def one_line(text: object) -> str:
    """A library's (often multi-line) message as one line."""
    return " ".join(str(text).split())


# TensorStore reports an OS error inside its own message: "... [os_error_code='28']".
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def os_error_reason(e: BaseException) -> str | None:
    """'no space left on device' (the OS's words, lower-cased) for an OSError or a TensorStore
    error that carries an OS error code; None for anything else."""
    code = e.errno if isinstance(e, OSError) else None
    if code is None:
        match = _OS_ERROR_CODE.search(str(e))
        code = int(match.group(1)) if match else None
    if code is None:
        return None
    reason = os.strerror(code)
    return reason[:1].lower() + reason[1:]


def describe(e: BaseException) -> str:
    """The one line the boundary prints for e."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        target = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
        return f"{os_error_reason(e) or e.strerror}: {target}"
    return one_line(e)


@contextmanager
def writing(path) -> Iterator[None]:
    """Name `path` in an OSError raised without a file name: a failed write() (a full disk,
    a file size limit) reports only its errno."""
    try:
        yield
    except OSError as e:
        if e.filename is None and e.strerror:
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise


def warn(message: str) -> None:
    """A warning the user should read (what a fallback did instead), on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _quiet_background_failures() -> None:
    """Keep what background threads print about a failure the boundary reports in one line.

    A checkpoint save that fails on a full disk is logged with tracebacks by Orbax (through
    absl) and by the event loop its writes ran on; the writes still in flight then call back
    into that closed loop, and TensorStore prints each RuntimeError('Event loop is closed') as
    an unraisable exception; the TensorBoard writer's thread dies with its own traceback. A
    restore that fails on a corrupt file leaves Orbax's other read coroutines un-awaited,
    each printed when collected. The error itself reaches the boundary (or the checkpoint
    fallback). Installed for the rest of the process: those callbacks can still arrive after
    the error line."""
    for name in ("absl", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    unraisable, thread_failed = sys.unraisablehook, threading.excepthook

    def on_unraisable(u) -> None:
        late_callback = (u.object is None and isinstance(u.exc_value, RuntimeError)
                         and str(u.exc_value) == "Event loop is closed")
        code = getattr(u.object, "cr_code", None)  # a coroutine's
        orbax_leftover = code is not None and "/orbax/" in code.co_filename.replace("\\", "/")
        if not (late_callback or orbax_leftover):
            unraisable(u)

    def on_thread_failure(args) -> None:
        if isinstance(args.exc_value, OSError):  # a disk error; the main thread meets it too
            warn(f"background thread {args.thread.name if args.thread else '?'} stopped: "
                 f"{describe(args.exc_value)}")
        else:
            thread_failed(args)

    sys.unraisablehook, threading.excepthook = on_unraisable, on_thread_failure


def run_main(body: Callable[[], int], debug: bool) -> int:
    """The error boundary: body's exit code, or one line and 2 for a user error (1 for a
    failed run). With debug, the traceback is printed before that line, and nothing that
    background threads print is held back."""
    if not debug:
        _quiet_background_failures()
    try:
        return body()
    except Interrupted as e:
        print(str(e), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except (UserError, OSError, RunFailed) as e:
        if debug:
            traceback.print_exc()
        print(f"{getattr(e, 'label', 'error')}: {describe(e)}", file=sys.stderr, flush=True)
        if isinstance(e, NotReady):
            return EXIT_NOT_READY
        return EXIT_RUN_FAILED if isinstance(e, RunFailed) else EXIT_USER_ERROR


def _interrupted_outside_training(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    print(f"{name}: stopped with no training step in progress, so nothing to save; rerun the "
          f"same command to go on", file=sys.stderr, flush=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def quiet_interrupts(as_command: bool = True) -> None:
    """For a command's own process (``as_command``; called before its heavy imports: jax
    takes about a second to import): a Ctrl-C outside training (during start-up, data
    preparation, between an experiment's units) is one line and death by SIGINT (130 in a
    shell), not a KeyboardInterrupt traceback. Training installs its own handler
    (trainer/signals.py), which stops after a step and saves it, and puts this one back when
    it ends. A module imported (a notebook, a test) passes False: nothing changes."""
    if as_command and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted_outside_training)


def exit_process(code: int) -> NoReturn:
    """End a command's process with `code` (its ``__main__``: the entry point owns the process).

    What is left is the interpreter's clean-up (jax's and Orbax's atexit callbacks): a Ctrl-C
    there (a second one after a stop, say) would raise KeyboardInterrupt inside a callback and
    print its traceback under the line that said what was saved. From here on SIGINT ends the
    process at once, as SIGTERM does (128 + signal number): everything was written already."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(code)
