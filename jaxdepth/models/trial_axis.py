"""The trial axis: a run's K >= 1 trials stacked on a leading axis (trainer/state.py), a
function of one trial applied to every one of them (``over_trials``), and ``Models``, which
evaluates one model or K of them with one call.

Here, outside trainer/ and analysis/, so that both may use it (analysis/act_stats.py evaluates
``Models``; the trainer imports analysis, not the other way round).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import equinox as eqx
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def select(tree, k: int):
    """Trial k of a stacked pytree (arrays [K, ...] -> [...]); other leaves as they are."""
    return jax.tree.map(lambda x: x[k] if eqx.is_array(x) else x, tree)


def stack(trees: Sequence) -> Any:
    """K pytrees of the same structure as one, their arrays stacked on a leading axis."""
    return jax.tree.map(lambda *xs: jax.numpy.stack(xs) if eqx.is_array(xs[0]) else xs[0],
                        *trees)


TRIAL_AXIS = "trials"  # the vmapped axis's name, for a function that reduces over trials


def over_trials(fn: Callable, stacked: Sequence[bool],
                axis_name: str | None = TRIAL_AXIS) -> Callable:
    """fn, a function of one trial, vmapped over K > 1 trials: the arguments marked in
    `stacked` hold every trial on a leading axis (their arrays: other leaves are static), the
    others are every trial's alike; each output array comes back with the trial axis. One
    trial is never vmapped (a vmap of one changes XLA's kernels, and the last bits of what a
    solo run computes on the CPU): ``Models`` calls its one model as it is, and the train
    step takes a run of one's trial axis off (trainer/state.py: make_step)."""
    return eqx.filter_vmap(fn, in_axes=tuple(eqx.if_array(0) if s else None for s in stacked),
                           axis_name=axis_name)


@functools.cache
def _jitted(fn: Callable, n_args: int) -> Callable:
    # one program per device function and argument shapes (K among them); the arrays every
    # trial shares (Models.shared, or None) enter once, unbatched
    def call(stacked, shared, *args):
        return fn(stacked if shared is None else eqx.combine(stacked, shared), *args)
    return eqx.filter_jit(over_trials(call, (True, False) + (False,) * n_args))


@functools.cache
def _per_device(fn: Callable, stacked: bool, mesh: Mesh, trial_axis: str | None,
                row_axes: tuple[str, ...], n_rows: int, static: tuple) -> Callable:
    """fn under jax.shard_map over every axis of `mesh`: each device gets its trials (every
    one, or its share over `trial_axis`), vmapped as Models' call vmaps them, or the one model
    (not stacked), and its rows (split over `row_axes`), and computes alone."""
    def call(arrays, shared, *rows):
        model = eqx.combine(arrays, static[0]) if shared is None else \
            eqx.combine(arrays, shared, static[0])
        return fn(model, *rows, *static[1:])

    def body(arrays, shared, *rows):
        if not stacked:
            return jax.tree.map(lambda x: x[None], call(arrays, shared, *rows))
        # the trials' own arrays mapped, the ones they share (one copy) not
        return eqx.filter_vmap(call, in_axes=(eqx.if_array(0), None) + (None,) * n_rows,
                               axis_name=TRIAL_AXIS)(arrays, shared, *rows)

    row, trials = P(row_axes), P(trial_axis) if trial_axis else P()  # (P() fits a scalar)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(trials, P()) + (row,) * n_rows,
                                 out_specs=P(trial_axis, row_axes), check_vma=True))


def _mesh_of(tree) -> Mesh:
    """The mesh the arrays of `tree` are laid out on (a one-device mesh where they are on one
    device)."""
    arrays = jax.tree.leaves(eqx.filter(tree, eqx.is_array))
    for x in arrays:
        if isinstance(x.sharding, NamedSharding):
            return x.sharding.mesh
    device = next(iter(arrays[0].devices()))
    return Mesh(np.asarray([device]), ("data",))


def _gathered(x):
    """x whole in this process: itself (still computing: a caller may dispatch more before it
    reads any), or gathered where other processes' devices hold some of its rows."""
    return x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)


def shared_spec(shared) -> Any:
    """Filter spec of the leaves `shared` holds (Models.shared, TrainState.shared)."""
    return jax.tree.map(lambda x: x is not None, shared, is_leaf=lambda x: x is None)


class Models:
    """The model(s) an evaluation runs: one model, or a run's K trials stacked on a leading
    axis. ``models(fn, *args)`` gives one output of ``fn(model, *args)`` per model: one
    model, or one trial of K, is that call, unchanged; K > 1 is one call of fn vmapped over
    the trial axis (over_trials), the arguments (a batch, prompts) shared. So a task writes
    its evaluation once and a run with trials evaluates every trial in one program per device
    function. `fn` must be a module-level function (its vmapped program is cached by
    identity) taking its arguments positionally.

    shared: with trials, the arrays every trial holds alike (a frozen pretrained backbone),
    kept once: a model-shaped pytree holding them, None elsewhere, where the stacked model
    holds None (trainer/state.py)."""

    def __init__(self, model: eqx.Module, n_trials: int | None = None, shared=None):
        self.model, self.n_trials, self.shared = model, n_trials, shared

    def __len__(self) -> int:
        return 1 if self.n_trials is None else self.n_trials

    def __call__(self, fn: Callable, *args) -> list:
        if len(self) == 1:  # one model: the call itself, never a vmap of one
            return [fn(self.one(0), *args)]
        out = _jitted(fn, len(args))(self.model, self.shared, *args)
        return [select(out, k) for k in range(self.n_trials)]

    def per_device(self, fn: Callable, rows: Sequence[np.ndarray], *static) -> list:
        """One output of ``fn(model, *rows, *static)`` per model, every device computing its
        own share alone (``jax.shard_map`` over every axis of the models' mesh: no collective
        between devices), so that a loop in fn (decoding, ACT's halting) stops on each device
        when its own rows are done. The rows (arrays with the rows first, every process's
        alike) are split over the devices, or over the model axis where the trials are split
        over the data axis (each device then runs its trials on those rows); a last share is
        filled with copies of the first row. fn's outputs have the rows first: a device's
        rows carry its own loop counts. `static`: fn's other arguments (hashable). Each
        device holds whole models: the parameters a mesh splits are gathered first."""
        stacked = len(self) > 1  # one model, or a trial of one: the call itself, no vmap
        model, shared = (self.model, self.shared) if stacked else (self.one(0), None)
        mesh = _mesh_of(model)
        arrays, rest = eqx.partition(model, eqx.is_array)
        lead = [x.sharding.spec[0] if isinstance(x.sharding, NamedSharding) and x.sharding.spec
                else None for x in jax.tree.leaves(arrays)] if stacked else []
        trial_axis = "data" if lead and all(a == "data" for a in lead) else None
        row_axes = tuple(a for a in mesh.axis_names if a != trial_axis)
        n = math.prod(mesh.shape[a] for a in row_axes)
        b = len(rows[0])
        rows = [np.concatenate([r, np.repeat(r[:1], -b % n, 0)]) for r in map(np.asarray, rows)]
        arrays = jax.device_put(arrays, NamedSharding(mesh, P(trial_axis) if trial_axis else P()))
        shared = None if shared is None else jax.device_put(
            eqx.filter(shared, eqx.is_array), NamedSharding(mesh, P()))
        rows = [jax.device_put(r, NamedSharding(mesh, P(row_axes))) for r in rows]
        out = _per_device(fn, stacked, mesh, trial_axis, row_axes, len(rows),
                          (rest, *static))(arrays, shared, *rows)
        out = jax.tree.map(lambda x: _gathered(x)[:, :b], out)
        return [select(out, k) for k in range(len(self))]

    def one(self, k: int) -> eqx.Module:
        """Model k (the model itself when it is one, unstacked)."""
        if self.n_trials is None:
            return self.model
        one = select(self.model, k)
        return one if self.shared is None else eqx.combine(one, self.shared)

    def pick(self, k: int) -> "Models":
        """Model k alone."""
        return Models(self.one(k))

    def map(self, f: Callable[[eqx.Module], eqx.Module]) -> "Models":
        """f applied to the model(s); f may change static fields only (with_options)."""
        return Models(f(self.model), self.n_trials,
                      None if self.shared is None else f(self.shared))
