"""A run's train state (one eqx.Module), its sharded initialisation, and its jitted step.

Every run is K >= 1 trials (trials.py), stacked on a leading trial axis; a run without trials
is K = 1. One trial's update (``make_update``) is applied to every trial, jitted once:
vmapped when K > 1, called on the trial itself when K = 1 (make_step). What varies between
trials goes in as arrays: the seed, the settings that vary (``hparams``: the schedule and
weight decay are built from them inside the step; dropout rates and ACT's ponder weight reach
the model through trial_tracing), and each trial's batches. A trial whose values turn
non-finite is frozen: its update is masked and the others go on (a run of one stops).
Arrays every trial holds alike and never trains (a frozen pretrained backbone) are kept once,
outside the trial axis (``TrainState.shared``). The trial axis's placement on a mesh is
sharding.py's (trial_mesh_axis).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array

from ..config import Config
from ..config.trials import own_pretrained, setting_value, varying
from ..models.trial_axis import Models, over_trials, select, shared_spec, stack
from ..models.trial_tracing import DROPOUT_SETTINGS, SCALAR_SETTINGS, Keep, trial_values
from . import sharding as shd
from ..optim import make_optimizer
from .memory import with_compile_check
from .task import Task

# Optimizer settings a trial may vary, as make_optimizer's keyword arguments.
OPTIM_HPARAMS = {"optim.lr": "lr", "optim.weight_decay": "weight_decay"}


class TrainState(eqx.Module):
    """The K trials' state, every leaf on a leading trial axis [K, ...] but `shared`'s; one
    trial's (select(state, k), or what the step's update sees) is the same type without it."""

    step: Array  # int32[K]: optimizer steps taken (the same in every trial)
    model: eqx.Module  # whatever the task builds; None where `shared` holds the array
    opt_state: optax.OptState
    key: Array  # uint32[K, 2] raw key data; dropout at step s uses fold_in(key, s)
    # float32[K] per setting the trials vary: make_optimizer's keyword for an optimizer
    # setting, the setting's name for one a model reads (a dropout rate as its keep
    # probability 1 - rate); {} when nothing varies
    hparams: dict
    frozen: Array  # bool[K]: trials stopped by a non-finite value; K > 1 masks their updates
    # the arrays every trial holds alike and never trains, once (no trial axis): a
    # model-shaped pytree holding them, None elsewhere; None when the trials share nothing
    shared: Any = None

    @property
    def n_trials(self) -> int:
        return self.frozen.shape[0]

    def models(self) -> Models:
        """The K trials' models, for an evaluation."""
        return Models(self.model, self.n_trials, self.shared)

    def trial(self, k: int) -> "TrainState":
        """Trial k alone, as a run of one (its trial axis of one, nothing shared)."""
        one = select(self, k)
        model = one.model if self.shared is None else eqx.combine(one.model, self.shared)
        return stack([TrainState(one.step, model, one.opt_state, one.key, {}, one.frozen)])


def init_one(cfg: Config, tx: optax.GradientTransformation, task: Task, given=None,
             seed=None) -> TrainState:
    """One trial's fresh state (no trial axis); `given`: a model-shaped pytree whose arrays
    replace the fresh ones (None leaves stay fresh); seed: in place of cfg.run.seed (a
    trial's, traced: the same key, so the same weights as a solo run of that seed)."""
    key = jax.random.key(cfg.run.seed if seed is None else seed)
    model = task.build_model(key=jax.random.fold_in(key, 0))
    if given is not None:
        model = jax.tree.map(lambda g, f: f if g is None else g, given, model,
                             is_leaf=lambda x: x is None)
    params = eqx.filter(model, model.trainable_spec())
    return TrainState(jnp.int32(0), model, tx.init(params),
                      jax.random.key_data(jax.random.fold_in(key, 1)), {}, jnp.bool_(False))


def hparams(cfgs: list[Config]) -> dict[str, np.ndarray]:
    """float32[K] per varying setting the step reads (TrainState.hparams). A dropout rate is
    carried as 1 - rate, computed in float64 as a solo run's Python float is."""
    out = {}
    for f in varying(cfgs):
        values = np.asarray([setting_value(c, f) for c in cfgs], np.float64)
        if f in OPTIM_HPARAMS:
            out[OPTIM_HPARAMS[f]] = values.astype(np.float32)
        elif f in DROPOUT_SETTINGS:
            out[f] = (1.0 - values).astype(np.float32)
        elif f in SCALAR_SETTINGS:
            out[f] = values.astype(np.float32)
    return out


def _shared_spec(cfgs: list[Config], task: Task, model) -> Any:
    """Filter spec of the model's arrays that every trial shares (Task.trial_shared), or
    None: never when the trials start from different pretrained runs."""
    if own_pretrained(cfgs):
        return None
    spec = task.trial_shared(model)
    return spec if spec is not None and any(jax.tree.leaves(spec)) else None


def _split(state: TrainState, spec) -> tuple[TrainState, Any]:
    """(state with the shared arrays taken out of its model, the shared arrays)."""
    shared, own = eqx.partition(state.model, spec)
    return replace(state, model=own), shared


def state_shardings(cfgs: list[Config], tx, mesh: Mesh, task: Task):
    """(abstract state of the K trials, matching pytree of NamedShardings)."""
    k, axis = len(cfgs), shd.trial_mesh_axis(mesh, len(cfgs))
    one = eqx.filter_eval_shape(lambda: init_one(cfgs[0], tx, task))
    p_sh = shd.param_shardings(one.model, mesh, cfgs[0].mesh.fsdp)
    spec = one.model.trainable_spec()
    o_sh = shd.opt_state_shardings(tx, one.opt_state, eqx.filter(one.model, spec),
                                   eqx.filter(p_sh, spec), mesh)
    rep = shd.replicated(mesh)
    solo = TrainState(rep, p_sh, o_sh, rep, {}, rep)
    shared = shared_sh = None
    spec = _shared_spec(cfgs, task, one.model)
    if spec is not None:  # kept once, placed as a solo run places them
        one, shared = _split(one, spec)
        solo, shared_sh = _split(solo, spec)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), one)
    sh = jax.tree.map(lambda s: shd.stacked(s, axis), solo)
    hp = {n: jax.ShapeDtypeStruct((k,), jnp.float32) for n in hparams(cfgs)}
    vec = NamedSharding(mesh, P(axis))
    return (replace(abstract, hparams=hp, shared=shared),
            replace(sh, hparams={n: vec for n in hp}, shared=shared_sh))


def abstract_model(abstract: TrainState):
    """One trial's abstract model (ShapeDtypeStruct leaves), shared arrays included."""
    model = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), abstract.model)
    return model if abstract.shared is None else eqx.combine(model, abstract.shared)


def initialise(cfgs: list[Config], tx, task: Task, shardings, pretrained=None) -> TrainState:
    """The K fresh states, each trial's weights those of a solo run of its seed, placed with
    `shardings` (state_shardings'). pretrained: the model with the task's pretrained arrays
    (Task.initial_model of the abstract model; the leaves it leaves abstract start fresh), for
    every trial, or a list of them, trial k's the k-th; the arrays `shardings` keeps once
    (TrainState.shared) are trial 0's, every trial's being the same.

    One init program with the seed as an argument, called once per trial, then stacked: the
    weights of a vmap over the seeds, which compiled 3x slower on the CPU (docs/design.md §6).
    The pretrained arrays enter that jitted init, so the fresh weights they replace are dead
    code XLA drops (seconds for a 22M-parameter backbone), and the state comes out committed
    to its shardings, as the step's own outputs are (else the step compiles twice)."""
    per_trial = isinstance(pretrained, list)  # each trial's own weights (task.init_from {seed})
    given = [eqx.filter(p, eqx.is_array) for p in pretrained] if per_trial else (
        [None if pretrained is None else eqx.filter(pretrained, eqx.is_array)] * len(cfgs))
    one = eqx.filter_jit(lambda seed, g: init_one(cfgs[0], tx, task, g, seed=seed))
    states = [one(jnp.int32(c.run.seed), g) for c, g in zip(cfgs, given)]
    spec = None if shardings.shared is None else shared_spec(shardings.shared)

    @eqx.filter_jit
    def place(states, hp):
        shared = None
        if spec is not None:
            states, shared = zip(*(_split(s, spec) for s in states))
            shared = shared[0]
        return eqx.filter_shard(replace(stack(states), hparams=hp, shared=shared), shardings)

    return place(states, {n: jnp.asarray(v) for n, v in hparams(cfgs).items()})


def make_update(cfg: Config, task: Task, micro_sharding, dropout: bool, groups: int):
    """update(state, batch, tx) -> (new state, metrics): one trial's optimizer step over its
    global batch (no trial axis), split into cfg.optim.accum_steps micro-batches; not jitted
    (make_step applies it to every trial).

    The task's objective (trainer/task.py) gives each micro-batch's share of the batch
    objective, so the update does not depend on how the batch is split; with a "divisor" in
    its totals it returns sums, and the summed gradient and metrics (but "tokens") are divided
    once. micro_sharding places the micro-batches (None: left as they are). dropout: whether
    to draw dropout keys.

    groups > 1 (a trial's rows over that many data shards, several micro-batches): each
    micro-batch's rows are split into groups, a device's rows each, whose gradients are
    vmapped and accumulated apart, so that the devices reduce them once, after the scan, not
    once per micro-batch; the sums agree up to rounding. Only without dropout: a group's masks
    would not be its rows' share of the micro-batch's (docs/design.md §6)."""
    accum = cfg.optim.accum_steps
    objective_fn, total_fn = task.objective()
    # Differentiates its first argument only: the arrays left in `static` (a frozen backbone)
    # enter the objective as constants, so no gradient is computed for them at all.
    grad_fn = eqx.filter_value_and_grad(
        lambda p, static, *a: objective_fn(eqx.combine(p, static), *a), has_aux=True)

    def split(x):  # row b goes to micro-batch b % accum, so every device feeds every micro-batch
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        if groups > 1:  # [accum, groups, rows of a group]: group g holds device g's rows
            x = x.reshape(accum, groups, x.shape[1] // groups, *x.shape[2:])
        return x if micro_sharding is None else jax.lax.with_sharding_constraint(x, micro_sharding)

    if groups > 1 and dropout:  # a group's masks would not be its rows' share
        raise ValueError(f"make_update: groups {groups} only without dropout (dropout=False)")

    def group_grads(params, static, mb, k, totals):
        """grad_fn of each group of the micro-batch, stacked (k is None: no dropout)."""
        return jax.vmap(grad_fn, in_axes=(None, None, 0, None, None))(params, static, mb, k,
                                                                      totals)

    micro_grad = grad_fn if groups == 1 else group_grads

    def update(state: TrainState, batch, tx: optax.GradientTransformation):
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
        totals = total_fn(batch)
        micro = jax.tree.map(split, batch)
        params, static = eqx.partition(state.model, state.model.trainable_spec())

        def body(carry, xs):
            g_acc, m_acc = carry
            mb, i = xs
            k = jax.random.fold_in(key, i) if dropout else None
            (_, metrics), g = micro_grad(params, static, mb, k, totals)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            return (g_acc, jax.tree.map(jnp.add, m_acc, metrics)), None

        m_shape = jax.eval_shape(lambda: micro_grad(params, static,
                                                    jax.tree.map(lambda x: x[0], micro), None,
                                                    totals)[0][1])
        m_zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), m_shape)
        # a gradient per group, or laid out as the parameters (under FSDP: sharded as they are)
        g_zeros = jax.tree.map(lambda p: jnp.zeros((groups, *p.shape), p.dtype), params) \
            if groups > 1 else jax.tree.map(jnp.zeros_like, params)
        (grads, sums), _ = jax.lax.scan(body, (g_zeros, m_zeros), (micro, jnp.arange(accum)))
        if groups > 1:  # the one reduction over the devices
            grads, sums = jax.tree.map(lambda x: x.sum(0), (grads, sums))
        if "divisor" in totals:
            d = totals["divisor"]
            grads = jax.tree.map(lambda g: g / d, grads)
            sums = {k: (v if k == "tokens" else v / d) for k, v in sums.items()}
        updates, opt_state = tx.update(grads, state.opt_state, params)
        model = eqx.apply_updates(state.model, updates)
        new = replace(state, step=state.step + 1, model=model, opt_state=opt_state)
        # param_norm lets the loop refuse to checkpoint parameters the update made non-finite
        # (the loss of this step was computed before the update, so it cannot tell).
        metrics = dict(sums)
        metrics.update(grad_norm=optax.tree.norm(grads),
                       param_norm=optax.tree.norm(eqx.filter(model, eqx.is_array)))
        return new, metrics

    return update


def make_step(cfgs: list[Config], mesh: Mesh, shardings, tasks: list[Task], on_compile=None):
    """run(state, batch [K, B, ...]) -> (state, metrics: [K] arrays, with "frozen").

    One jitted program: one trial's update applied to every trial, each with its own
    optimizer settings; a trial that is frozen, or whose loss, gradient norm or updated
    parameters are not finite, keeps its state (and is frozen from then on; a run of one
    stops instead). The state is donated and the new one placed with `shardings`. The
    objective is trial 0's task's; dropout keys are drawn when any trial's own model (built
    abstractly) has dropout: trial 0's static rate may be 0 where another's is not, and a
    trial at rate 0 then keeps every unit, as its solo run does without a key. See
    memory.with_compile_check for on_compile and the returned function."""
    cfg = cfgs[0]
    axis = shd.trial_mesh_axis(mesh, len(cfgs))
    dropout = any(eqx.filter_eval_shape(t.build_model, key=jax.random.key(0)).uses_dropout
                  for t in tasks)
    # a trial's rows over several data shards, in micro-batches: each device accumulates its
    # own gradients (make_update's groups), but under FSDP (its gradients reduce-scattered per
    # micro-batch, sharded as the parameters are) and with dropout (its masks would depend on
    # the mesh: a run would not equal itself on another mesh, nor a solo run its trial)
    groups = mesh.shape["data"] if not axis and cfg.optim.accum_steps > 1 \
        and not cfg.mesh.fsdp and not dropout else 1
    # within a trial, its rows over the data axis unless the trials took it
    update = make_update(cfg, tasks[0], None if axis else NamedSharding(mesh, P(None, "data")),
                         dropout=dropout, groups=groups)

    def one(state: TrainState, batch, shared):
        mine = state  # this trial's own arrays
        if shared is not None:  # the trial's whole model; only its own arrays come back
            state = replace(state, model=eqx.combine(state.model, shared))
        hp = state.hparams
        tx = make_optimizer(cfg.optim, cfg.run.steps,
                            **{n: v for n, v in hp.items() if n in OPTIM_HPARAMS.values()})
        model_values = {n: Keep(v) if n in DROPOUT_SETTINGS else v
                        for n, v in hp.items() if n not in OPTIM_HPARAMS.values()}
        with trial_values(model_values):
            new, m = update(state, batch, tx)
        if shared is not None:  # never trained: the same arrays as went in
            new, _ = _split(new, shared_spec(shared))
        bad = ~(jnp.isfinite(m["loss"]) & jnp.isfinite(m["grad_norm"])
                & jnp.isfinite(m["param_norm"]))
        stop = mine.frozen | bad
        if len(cfgs) > 1:  # a frozen trial keeps its state while the others go on
            kept = jax.tree.map(lambda n, o: jnp.where(stop, o, n),
                                eqx.filter(new, eqx.is_array), eqx.filter(mine, eqx.is_array))
            new = eqx.combine(kept, new)
        new = replace(new, step=mine.step + 1, hparams=mine.hparams, frozen=stop)
        return new, {**m, "frozen": stop}

    def own(state: TrainState) -> TrainState:  # the trials' own arrays, the shared ones apart
        return replace(state, shared=None)

    if len(cfgs) > 1:
        per_trial = over_trials(one, (True, True, False), axis_name=None)

        @eqx.filter_jit(donate="all-except-first")
        def step(batch, state: TrainState):
            new, m = per_trial(own(state), batch, state.shared)
            return eqx.filter_shard(replace(new, shared=state.shared), shardings), m

        return with_compile_check(lambda state, batch: step(batch, state),
                                  lambda state, batch: step.lower(batch, state), on_compile)

    # A run of one (told apart here and in checkpoint.py's layout; docs/design.md §6): its
    # trial axis is taken off before the jitted step and put back after (`take` and `put`
    # donate the state: XLA reuses its buffers), and a non-finite value is not masked but
    # stops the run (watchers.NonFinite). A vmap of one would change XLA's kernels on the CPU,
    # and the axis or the mask inside the program how it is partitioned over a model axis:
    # either, the last bits of what a run of one computes. The step is jitted on the state's
    # arrays (the other leaves bound at the first call), so that the memory check lowers it
    # from their shapes, without the trial axis, before `take` has donated the caller's state.
    solo = replace(jax.tree.map(shd.unstacked, own(shardings)), shared=shardings.shared)
    rows = shd.unstacked(shd.batch_sharding(mesh, 1))
    rest = []  # the state's leaves that are not arrays

    @eqx.filter_jit(donate="all-except-first")
    def take(batch, arrays: TrainState):
        return (jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x[0], rows), batch),
                eqx.filter_shard(replace(select(own(arrays), 0), shared=arrays.shared), solo))

    @functools.partial(jax.jit, donate_argnums=1)
    def step(batch, arrays: TrainState):
        state = eqx.combine(arrays, rest[0])
        new, m = one(own(state), batch, state.shared)
        return eqx.filter(eqx.filter_shard(replace(new, shared=state.shared), solo),
                          eqx.is_array), m

    @eqx.filter_jit(donate="all")
    def put(arrays: TrainState, metrics):
        back = replace(stack([own(arrays)]), shared=arrays.shared)
        return eqx.filter_shard(back, shardings), jax.tree.map(lambda x: x[None], metrics)

    def arrays_of(state: TrainState) -> TrainState:
        arrays, others = eqx.partition(state, eqx.is_array)
        if not rest:  # bound once: each later state is the step's own, with these same leaves
            rest.append(others)
        elif not _same(others, rest[0]):
            raise ValueError("make_step: a run of one's state changed its non-array leaves "
                             "(its structure or a static value) since the step's first call")
        return arrays

    def call(state: TrainState, batch):
        arrays, metrics = put(*step(*take(batch, arrays_of(state))))
        return eqx.combine(arrays, rest[0]), metrics

    def lower(state: TrainState, batch):
        arrays = arrays_of(state)
        taken = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=rows),
                             batch)
        mine = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=s),
                            own(arrays), own(solo))
        whole = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             arrays.shared, solo.shared)  # placed as take places them
        return step.lower(taken, replace(mine, shared=whole))

    return with_compile_check(call, lower, on_compile)


def _same(a, b) -> bool:
    """Whether two pytrees have one structure and equal leaves (the non-array ones)."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x is y or x == y for x, y in zip(la, lb))


def start(cfgs: list[Config], tasks: list[Task], mesh: Mesh, pretrained=None,
          on_compile=None) -> tuple[TrainState, Any, TrainState]:
    """(fresh state, step, shardings) of the K trials of cfgs, each with its task, built as
    the training loop builds them but without its data, hooks and checkpoints: what a
    benchmark or a test steps with batches of its own ([K, B, ...])."""
    tx = make_optimizer(cfgs[0].optim, cfgs[0].run.steps)
    _, shardings = state_shardings(cfgs, tx, mesh, tasks[0])
    state = initialise(cfgs, tx, tasks[0], shardings, pretrained)
    return state, make_step(cfgs, mesh, shardings, tasks, on_compile), shardings
