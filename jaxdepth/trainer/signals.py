"""SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) while training: the hook that turns
the first into a stop after the step in progress, with its checkpoint."""
from __future__ import annotations

import os
import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils


class StopSignals:
    """SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) while training: the first asks the
    loop to stop after the step in progress and save it (``signum`` is then set); the same
    signal again exits at once, without saving, by the signal's default action. Installed only
    on the main thread (the only one Python lets set handlers); the previous handlers come back
    on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0
        self.finishing = False  # past the last step: the final evaluation and summary
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            # None: a handler not set from Python, which cannot be put back
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum and self.signum != signum:
            # Another signal asking for the same stop: a Ctrl-C reaches a sweep's workers from
            # the terminal and again as the SIGTERM their parent forwards (experiments/workers).
            print(f"{name}: already stopping after the current step "
                  f"({signal.Signals(self.signum).name})", file=sys.stderr, flush=True)
            return
        if self.signum:
            print(f"{name} again: exiting at once, without saving", file=sys.stderr, flush=True)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        if self.finishing:  # every step is trained and saved: only the evaluation is left
            print(f"{name}: the last step is trained and saved; finishing the final evaluation "
                  f"and summary.json (send it again to exit at once, without them: rerunning "
                  f"the same command then evaluates again)", file=sys.stderr, flush=True)
            return
        print(f"{name}: stopping after the current step, once its checkpoint is saved (send it "
              f"again to exit at once, without saving)", file=sys.stderr, flush=True)

    def agreed(self) -> int:
        """The signal that stops the run after this step (0: none). Several processes agree,
        since a signal may reach one host only: every process calls this at every step."""
        if jax.process_count() == 1:
            return self.signum
        return int(np.max(np.asarray(multihost_utils.process_allgather(np.int32(self.signum)))))
