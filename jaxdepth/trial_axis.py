"""The trial axis: K models of the same shapes stacked on a leading axis (a run's trials,
trainer/trials.py), and ``Models``, which evaluates one model or K of them with one call.

Here, outside trainer/ and analysis/, so that both may use it (analysis/act_stats.py evaluates
``Models``; the trainer imports analysis, not the other way round).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import equinox as eqx
import jax


def select(tree, k: int):
    """Trial k of a stacked pytree (arrays [K, ...] -> [...]); other leaves as they are."""
    return jax.tree.map(lambda x: x[k] if eqx.is_array(x) else x, tree)


TRIAL_AXIS = "trials"  # the vmapped axis's name, for a function that reduces over trials


@functools.cache
def _over_trials(fn: Callable, n_args: int, shares: bool) -> Callable:
    # one program per device function and argument shapes, as the solo function has; the
    # arrays every trial shares (Models.shared) enter once, unbatched
    if shares:
        def call(stacked, shared, *args):
            return fn(eqx.combine(stacked, shared), *args)
    else:
        def call(stacked, shared, *args):
            return fn(stacked, *args)
    return eqx.filter_jit(eqx.filter_vmap(call, in_axes=(eqx.if_array(0), None) + (None,) * n_args,
                                          axis_name=TRIAL_AXIS))


def shared_spec(shared) -> Any:
    """Filter spec of the leaves `shared` holds (Models.shared, TrialState.shared)."""
    return jax.tree.map(lambda x: x is not None, shared, is_leaf=lambda x: x is None)


class Models:
    """The model(s) an evaluation runs: one (a solo run) or a run's K trials, stacked on a
    leading axis. ``models(fn, *args)`` gives one output of ``fn(model, *args)`` per trial:
    for one model it is that call, unchanged; for K it is one call of fn vmapped over the
    trial axis, the arguments (a batch, prompts) shared. So a task writes its evaluation once
    and a run with trials evaluates every trial in one program per device function. `fn`
    must be a module-level function (its vmapped program is cached by identity) taking its
    arguments positionally.

    shared: with trials, the arrays every trial holds alike (a frozen pretrained backbone),
    kept once: a model-shaped pytree holding them, None elsewhere, where the stacked model
    holds None (trainer/trials.py)."""

    def __init__(self, model: eqx.Module, n_trials: int | None = None, shared=None):
        self.model, self.n_trials, self.shared = model, n_trials, shared

    def __len__(self) -> int:
        return 1 if self.n_trials is None else self.n_trials

    @property
    def axis_name(self) -> str | None:
        """The trial axis's name inside ``models(fn, ...)``; None for one model."""
        return None if self.n_trials is None else TRIAL_AXIS

    def __call__(self, fn: Callable, *args) -> list:
        if self.n_trials is None:
            return [fn(self.model, *args)]
        out = _over_trials(fn, len(args), self.shared is not None)(self.model, self.shared,
                                                                      *args)
        return [select(out, k) for k in range(self.n_trials)]

    def one(self, k: int) -> eqx.Module:
        """Trial k's model (the model itself for a solo run)."""
        if self.n_trials is None:
            return self.model
        one = select(self.model, k)
        return one if self.shared is None else eqx.combine(one, self.shared)

    def map(self, f: Callable[[eqx.Module], eqx.Module]) -> "Models":
        """f applied to the model(s); f may change static fields only (with_options)."""
        return Models(f(self.model), self.n_trials,
                      None if self.shared is None else f(self.shared))
