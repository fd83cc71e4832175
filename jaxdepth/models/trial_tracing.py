"""The settings traced per trial: how a model reads a setting that the trials of one compiled
step vary (``setting``, ``may_drop``, ``Keep``), and how a trial step sets them
(``trial_values``).

A model's dropout rate and ACT's ponder weight are fields of its static config: one number per
compiled program. Trials (trainer/trials.py) vary them inside one program, so their step sets
each varying setting's per-trial value while it traces the update, and a model reads it through
``setting``: the trial's traced value inside that trace, its config's float everywhere else. A
context rather than an argument, so that every task's objective and model call need not carry
the trials' plumbing down to every layer's dropout. A traced dropout rate travels as its keep
probability (``Keep``), computed on the host in float64 as a solo run's ``1.0 - rate`` is, so a
trial draws the solo run's masks bit for bit.
"""
from __future__ import annotations

import contextlib
import contextvars

# Settings (config "section.field") a model reads through `setting`.
DROPOUT_SETTINGS = ("model.dropout", "act.dropout", "fusion.dropout")
SCALAR_SETTINGS = ("act.tau",)

_VALUES: contextvars.ContextVar[dict] = contextvars.ContextVar("trial_values", default={})


class Keep:
    """A dropout rate traced per trial, held as its keep probability 1 - rate."""

    __slots__ = ("p",)

    def __init__(self, p):  # a traced float32 scalar
        self.p = p


@contextlib.contextmanager
def trial_values(values: dict):
    """Within the block, `setting(name, ...)` gives values[name] (a traced array, or a Keep
    for a dropout rate)."""
    token = _VALUES.set(values)
    try:
        yield
    finally:
        _VALUES.reset(token)


def setting(name: str | None, value: float):
    """The value of setting `name` for the trace in progress: a trial's traced value inside a
    trial step that varies it, else `value` (the model's config)."""
    return value if name is None else _VALUES.get().get(name, value)


def may_drop(rate) -> bool:
    """Whether dropout at `rate` can change anything: a traced rate can (it is 0 in some
    trials only), a float when it is above 0."""
    return isinstance(rate, Keep) or rate > 0.0

