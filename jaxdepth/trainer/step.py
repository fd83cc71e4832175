"""The train state (one eqx.Module), its sharded initialisation, and the jitted train step."""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array

from ..config import Config
from . import sharding as shd
from .task import Task


class TrainState(eqx.Module):
    step: Array  # int32 scalar: optimizer steps taken
    model: eqx.Module  # whatever the task builds
    opt_state: optax.OptState
    key: Array  # uint32 raw key data; dropout at step s uses fold_in(key, s)


def init_state(cfg: Config, tx: optax.GradientTransformation, task: Task,
               given=None, seed=None) -> TrainState:
    """A fresh state; `given`: a model-shaped pytree whose arrays replace the fresh ones
    (None leaves stay fresh); seed: in place of cfg.run.seed (a trial's, traced under vmap:
    the same key, so the same weights as a solo run of that seed)."""
    key = jax.random.key(cfg.run.seed if seed is None else seed)
    model = task.build_model(key=jax.random.fold_in(key, 0))
    if given is not None:
        model = jax.tree.map(lambda g, f: f if g is None else g, given, model,
                             is_leaf=lambda x: x is None)
    params = eqx.filter(model, model.trainable_spec())
    return TrainState(jnp.int32(0), model, tx.init(params),
                      jax.random.key_data(jax.random.fold_in(key, 1)))


def state_shardings(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh, task: Task):
    """(abstract state, matching pytree of NamedShardings)."""
    abstract = eqx.filter_eval_shape(lambda: init_state(cfg, tx, task))
    p_sh = shd.param_shardings(abstract.model, mesh, cfg.mesh.fsdp)
    spec = abstract.model.trainable_spec()
    o_sh = shd.opt_state_shardings(tx, abstract.opt_state, eqx.filter(abstract.model, spec),
                                   eqx.filter(p_sh, spec), mesh)
    rep = shd.replicated(mesh)
    return abstract, TrainState(rep, p_sh, o_sh, rep)


def sharded_init(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh, task: Task,
                 shardings=None, pretrained: eqx.Module | None = None) -> TrainState:
    """A fresh state created directly in its sharded layout (shardings as from state_shardings).

    pretrained: the model with the task's pretrained arrays (Task.initial_model of the abstract
    model; the leaves it leaves abstract are initialised fresh). They enter the same jitted
    init, so the fresh weights they replace are dead code XLA drops (a 22M-parameter backbone's
    random init cost seconds of compile and run), and the state comes out committed to its
    shardings, as the train step's own outputs are (else the step compiles twice)."""
    if shardings is None:
        _, shardings = state_shardings(cfg, tx, mesh, task)
    given = None if pretrained is None else eqx.filter(pretrained, eqx.is_array)
    init = eqx.filter_jit(lambda g: eqx.filter_shard(init_state(cfg, tx, task, g), shardings))
    return init(given)


def make_update(cfg: Config, task: Task, micro_sharding=None, dropout: bool | None = None):
    """update(state, batch, tx) -> (new state, metrics): one optimizer step over a global
    batch, split into cfg.optim.accum_steps micro-batches, not yet jitted (the solo step
    below jits it; trainer/trials.py vmaps it over trials first).

    The task's objective (see trainer/task.py) gives each micro-batch's share of the batch
    objective; shares add up to the batch value, so the update does not depend on how the
    batch is split. If its totals have a "divisor", the objective returns sums instead and the
    summed gradient and metrics (except "tokens") are divided by it once. micro_sharding, if
    given, places the micro-batches. dropout: whether to draw dropout keys (default: whether
    its model has dropout)."""
    accum = cfg.optim.accum_steps
    objective_fn, total_fn = task.objective()
    # Differentiates its first argument only: the arrays left in `static` (a frozen backbone)
    # enter the objective as constants, so no gradient is computed for them at all.
    grad_fn = eqx.filter_value_and_grad(
        lambda p, static, *a: objective_fn(eqx.combine(p, static), *a), has_aux=True)

    def split(x):  # row b goes to micro-batch b % accum, so every device feeds every micro-batch
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return x if micro_sharding is None else jax.lax.with_sharding_constraint(x, micro_sharding)

    def update(state: TrainState, batch, tx: optax.GradientTransformation):
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
        totals = total_fn(batch)
        micro = jax.tree.map(split, batch)
        params, static = eqx.partition(state.model, state.model.trainable_spec())
        # the model's static config says it (under trace), unless the trials decided
        use_dropout = state.model.uses_dropout if dropout is None else dropout

        def body(carry, xs):
            g_acc, m_acc = carry
            mb, i = xs
            k = jax.random.fold_in(key, i) if use_dropout else None
            (_, metrics), g = grad_fn(params, static, mb, k, totals)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            return (g_acc, jax.tree.map(jnp.add, m_acc, metrics)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        m_zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype),
                               jax.eval_shape(lambda: grad_fn(params, static,
                                                              jax.tree.map(lambda x: x[0], micro),
                                                              None, totals)[0][1]))
        (grads, sums), _ = jax.lax.scan(body, (zeros, m_zeros), (micro, jnp.arange(accum)))
        if "divisor" in totals:
            d = totals["divisor"]
            grads = jax.tree.map(lambda g: g / d, grads)
            sums = {k: (v if k == "tokens" else v / d) for k, v in sums.items()}
        updates, opt_state = tx.update(grads, state.opt_state, params)
        model = eqx.apply_updates(state.model, updates)
        new = TrainState(state.step + 1, model, opt_state, state.key)
        # param_norm lets the loop refuse to checkpoint parameters the update made non-finite
        # (the loss of this step was computed before the update, so it cannot tell).
        metrics = dict(sums)
        metrics.update(grad_norm=optax.tree.norm(grads),
                       param_norm=optax.tree.norm(eqx.filter(model, eqx.is_array)))
        return new, metrics

    return update


def with_compile_check(step, on_compile):
    """run(state, batch) calling the jitted step(batch, state). on_compile(compiled, state,
    batch), if given, sees the step compiled for its first call before that call runs, and
    may refuse it by raising (trainer/memory.py); the jit cache serves the call, so the step
    is still traced and compiled once. ``run.lower(state, batch)`` lowers the step without
    running it."""
    pending = [on_compile]

    def run(state, batch):
        if pending[0] is not None:
            check, pending[0] = pending[0], None
            check(step.lower(batch, state).compile(), state, batch)
        return step(batch, state)

    run.lower = lambda state, batch: step.lower(batch, state)
    return run


def make_train_step(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh, shardings,
                    task: Task, on_compile=None):
    """The jitted step of make_update, its state argument donated and its new state placed
    with `shardings`; see with_compile_check for on_compile and the returned function."""
    update = make_update(cfg, task, NamedSharding(mesh, P(None, "data")))

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, state: TrainState):
        new, metrics = update(state, batch, tx)
        return eqx.filter_shard(new, shardings), metrics

    return with_compile_check(step, on_compile)
