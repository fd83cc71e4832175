"""The train state (one eqx.Module), its sharded initialisation, and the jitted train step."""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array

from ..config import FUSION_TASKS, Config
from ..models.build import build_model
from ..models.decoder import DecoderLM
from ..models.fusion import fusion_trainable
from . import sharding as shd
from .losses import fused_lm_head_loss, lm_loss_sums


class TrainState(eqx.Module):
    step: Array  # int32 scalar: optimizer steps taken
    model: eqx.Module  # DecoderLM, or an encoder of models/act.py
    opt_state: optax.OptState
    key: Array  # uint32 raw key data; dropout at step s uses fold_in(key, s)


def trainable(model):
    """Filter spec of the arrays the optimiser updates. A model may say (a fusion model in FE
    mode leaves its backbone out); otherwise every float array except ``Frozen`` constants."""
    spec = getattr(model, "trainable_spec", None)
    return spec() if spec is not None else fusion_trainable(model)


def init_state(cfg: Config, tx: optax.GradientTransformation) -> TrainState:
    key = jax.random.key(cfg.run.seed)
    model = build_model(cfg, key=jax.random.fold_in(key, 0))
    params = eqx.filter(model, trainable(model))
    return TrainState(jnp.int32(0), model, tx.init(params),
                      jax.random.key_data(jax.random.fold_in(key, 1)))


def state_shardings(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh):
    """(abstract state, matching pytree of NamedShardings)."""
    abstract = eqx.filter_eval_shape(init_state, cfg, tx)
    p_sh = shd.param_shardings(abstract.model, mesh, cfg.mesh.fsdp)
    spec = trainable(abstract.model)
    o_sh = shd.opt_state_shardings(tx, abstract.opt_state, eqx.filter(abstract.model, spec),
                                   eqx.filter(p_sh, spec), mesh)
    rep = shd.replicated(mesh)
    return abstract, TrainState(rep, p_sh, o_sh, rep)


def sharded_init(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh,
                 shardings=None) -> TrainState:
    """A fresh state created directly in its sharded layout (shardings as from state_shardings)."""
    if shardings is None:
        _, shardings = state_shardings(cfg, tx, mesh)
    init = eqx.filter_jit(lambda: eqx.filter_shard(init_state(cfg, tx), shardings))
    return init()


def lm_objective(cfg: Config):
    """Causal / prefix LM: sums of weighted NLL (+ z-loss) per micro-batch; the step divides
    the summed gradient once by the batch's total weight ("divisor")."""
    z_loss = cfg.model.z_loss

    def objective(model, mb, key, totals):
        if not cfg.model.xent_chunk:
            logits = model(mb["inputs"], key=key)
            obj, nll, n = lm_loss_sums(logits, mb["targets"], mb["weights"], z_loss)
            return obj, {"loss": nll, "tokens": n}
        x_BTD, _ = model.hidden(mb["inputs"], key=key)
        head = model.lm_head.astype(model.compute_dtype)
        obj, nll = fused_lm_head_loss(x_BTD.reshape(-1, x_BTD.shape[-1]), head,
                                      mb["targets"].reshape(-1), mb["weights"].reshape(-1),
                                      z_loss, cfg.model.xent_chunk)
        return obj, {"loss": nll, "tokens": jnp.sum(mb["weights"])}

    return objective, lambda batch: {"divisor": jnp.sum(batch["weights"])}


def make_train_step(cfg: Config, tx: optax.GradientTransformation, mesh: Mesh, shardings,
                    objective=None):
    """One optimizer step over a global batch, split into cfg.optim.accum_steps micro-batches.

    `objective` = (fn, totals): totals(batch) gives the normalisers of the whole batch (e.g.
    its target-token count) and fn(model, micro_batch, key, totals) -> (value, metrics) the
    micro-batch's share of the batch objective and metrics. Shares add up to the batch value,
    so the update does not depend on how the batch is split. If totals has a "divisor", fn
    returns sums instead and the summed gradient and metrics (except "tokens") are divided by
    it once (default: lm_objective). The state argument is donated.
    """
    accum = cfg.optim.accum_steps
    objective_fn, total_fn = objective or lm_objective(cfg)
    micro_sharding = NamedSharding(mesh, P(None, "data"))
    # Differentiates its first argument only: the arrays left in `static` (a frozen backbone)
    # enter the objective as constants, so no gradient is computed for them at all.
    grad_fn = eqx.filter_value_and_grad(
        lambda p, static, *a: objective_fn(eqx.combine(p, static), *a), has_aux=True)

    def split(x):  # row b goes to micro-batch b % accum, so every device feeds every micro-batch
        x = x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, micro_sharding)

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, state: TrainState):
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
        use_dropout = _uses_dropout(cfg)
        totals = total_fn(batch)
        micro = jax.tree.map(split, batch)
        params, static = eqx.partition(state.model, trainable(state.model))

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
        new = eqx.filter_shard(new, shardings)
        # param_norm lets the loop refuse to checkpoint parameters the update made non-finite
        # (the loss of this step was computed before the update, so it cannot tell).
        metrics = dict(sums)
        metrics.update(grad_norm=optax.tree.norm(grads),
                       param_norm=optax.tree.norm(eqx.filter(model, eqx.is_array)))
        return new, metrics

    return lambda state, batch: step(batch, state)


def _uses_dropout(cfg: Config) -> bool:
    if cfg.task.name in FUSION_TASKS:
        return True  # the head's dropout, and a fine-tuned backbone's own
    return (cfg.act.dropout if cfg.model.arch in ("act", "albert", "bert") else cfg.model.dropout) > 0


@eqx.filter_jit
def eval_step(model: DecoderLM, batch):
    """Sums of NLL and weights over one (possibly padded) batch; no dropout."""
    logits = model(batch["inputs"])
    _, nll, n = lm_loss_sums(logits, batch["targets"], batch["weights"])
    return nll, n
