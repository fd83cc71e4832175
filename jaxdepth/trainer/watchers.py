"""Watchers of a run going wrong, shown every step's rows by hooks.py's Records: a trial whose
values turn non-finite (``NonFinite``: frozen, and the run stopped when every trial is) and one
that is not learning though every value is finite (``Stuck``: a warning)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import RunFailed, warn


class NonFiniteLossError(RunFailed):
    pass


# A run that is not learning, without any NaN: a warning (once) after this many steps in a row
# with a gradient norm of exactly 0, or (a run whose loss is a token NLL) with the loss within
# UNIFORM_TOLERANCE of ln(vocab_size), the loss of uniform predictions, after warm-up.
STUCK_STEPS = 20
UNIFORM_TOLERANCE = 1e-3
# ... or (a run from fresh weights) whose mean loss over the PROGRESS_WINDOW steps after warm-up
# is less than MIN_PROGRESS (relative) below its mean over its first PROGRESS_WINDOW steps: a
# fresh model at a working learning rate moves far more by then (tiny-L2 at its recipe's lr:
# the loss from 6.7 at step 1 to 3.0 at step 60, 55% down), one at lr 1e-12 0.01%. Runs from
# pretrained weights may start near their final loss, so they are not judged by it.
PROGRESS_WINDOW = 10
MIN_PROGRESS = 0.01


def non_finite(step: int, m: dict) -> str | None:
    """What is not finite in a step's metrics, in words; None if everything is."""
    values = [("loss", m["loss"]), ("gradient norm", m["grad_norm"]),
              ("parameter norm after the update", m["param_norm"])]
    bad = [f"{name} ({v})" for name, v in values if not math.isfinite(v)]
    if not bad:
        return None
    finite = [f"{name} {v}" for name, v in values if math.isfinite(v)]
    return (f"non-finite {' and '.join(bad)} at step {step}"
            f"{' (finite: ' + ', '.join(finite) + ')' if finite else ''}")


class NonFinite:
    """A trial whose values turn non-finite is frozen (with K > 1 trials its update masked by
    the step: state.make_step) and named once; the run stops when every trial is, which for a
    run of one is at once. A state whose values are not finite is never checkpointed."""

    def __init__(self, trials, mngr, checkpoints: Path):
        self.trials, self.mngr, self.checkpoints = trials, mngr, checkpoints
        self.seen: set[int] = set()  # the trials named frozen

    def __call__(self, step: int, rows: list[dict]) -> None:
        for k, m in enumerate(rows):
            why = non_finite(step, m)
            # a run of one has no "frozen" of its step's: its first non-finite value stops it
            if not m.get("frozen", why is not None) or k in self.seen:
                continue
            self.seen.add(k)
            why = why or "non-finite values"
            if len(self.seen) == self.trials.k:  # trial k was the last one going
                good = self.mngr.latest_step()
                kept = (f"The last good checkpoint (step {good}) in {self.checkpoints} is "
                        f"intact." if good is not None else "No checkpoint was saved yet.")
                if self.trials.several:
                    why = f"every trial is frozen (trial {k}, {self.trials.names[k]}: {why})"
                raise NonFiniteLossError(f"{why}; stopping. {kept}")
            warn(f"{self.trials.named(k)}{why}; frozen at its last finite state, the other "
                 f"trials go on")


class Stuck:
    """Warns once about a trial that is not learning though every value is finite: a gradient
    norm of exactly 0, a token loss at ln(vocab_size), or (from fresh weights) a loss that
    hardly moved from its first steps by the end of warm-up. One per trial, with its own
    config; `who` starts its warnings in a run of several ("trial 1 (optim.lr=1e-12): ")."""

    def __init__(self, cfg, ln_vocab: float | None, progress_from_start: bool, who: str = ""):
        self.cfg, self.ln_vocab, self.who = cfg, ln_vocab, who
        self.warmup = cfg.optim.warmup_steps or 0
        self.counts = {"zero_grad": 0, "uniform": 0}
        self.warned: set[str] = set()
        # the step at which the losses after warm-up are compared with the first ones (0: never)
        self.progress_at = (max(self.warmup, PROGRESS_WINDOW) + PROGRESS_WINDOW
                            if progress_from_start else 0)
        self.losses: dict[int, float] = {}

    def __call__(self, step: int, m: dict) -> None:
        c = self.counts
        c["zero_grad"] = c["zero_grad"] + 1 if m["grad_norm"] == 0 else 0
        uniform = (self.ln_vocab is not None and step > self.warmup
                   and abs(m["loss"] - self.ln_vocab) <= UNIFORM_TOLERANCE)
        c["uniform"] = c["uniform"] + 1 if uniform else 0
        steps = f"steps {step - STUCK_STEPS + 1}-{step}"
        if self._first("zero_grad"):
            warn(f"{self.who}the gradient norm has been exactly 0 for {STUCK_STEPS} steps in a row "
                 f"({steps}): the parameters get no gradient; the run is not learning")
        if self._first("uniform"):
            warn(f"{self.who}the loss has stayed at ln(vocab_size) = ln {self.cfg.vocab_size} = "
                 f"{self.ln_vocab:.4f} (uniform predictions) for {STUCK_STEPS} steps in a row "
                 f"after warm-up ({steps}): the run is not learning")
        self._progress(step, m["loss"])

    def _first(self, what: str) -> bool:
        if self.counts[what] != STUCK_STEPS or what in self.warned:
            return False
        self.warned.add(what)
        return True

    def _progress(self, step: int, loss: float) -> None:
        w = PROGRESS_WINDOW
        if step <= w or step > self.progress_at - w:
            self.losses[step] = loss
        if step != self.progress_at or any(self.counts.values()):
            return  # (a run the two detectors above are already watching is theirs to name)
        before = float(np.mean([self.losses[s] for s in range(1, w + 1)]))
        after = float(np.mean([self.losses[s] for s in range(step - w + 1, step + 1)]))
        drop = (before - after) / abs(before) if before else 0.0
        if drop < MIN_PROGRESS:
            warn(f"{self.who}the mean loss over steps {step - w + 1}-{step}, after warm-up, is "
                 f"{after:.4f}, {100 * drop:.2f}% below its mean over steps 1-{w} "
                 f"({before:.4f}): a model trained from fresh weights should have moved "
                 f"further; the run is hardly learning (optim.lr {self.cfg.optim.lr:g}?)")
