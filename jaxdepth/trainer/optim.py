"""The optimizer of a config: its class (jaxdepth/optimizers/), with the learning-rate
schedule, the weight-decay mask and global-norm clipping around it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ..config import OptimConfig
from ..optimizers import optimizer


def schedule(cfg: OptimConfig, total_steps: int, lr=None) -> optax.Schedule:
    """Learning rate as a function of the optimizer step (lr: in place of cfg.lr, e.g. a
    trial's, traced under vmap: trainer/trials.py).

    constant / linear / cosine: linear warmup from 0 over warmup_steps, then constant or a decay to
    lr * min_lr_ratio at total_steps. rsqrt is t5x's ``lr / sqrt(max(step, warmup_steps))``
    (the max() is its warmup: with lr=1 and 10k steps that is 0.01 for 10k steps, then decays).
    """
    base = cfg.lr if lr is None else lr
    if cfg.schedule == "rsqrt":
        return lambda step: base * jax.lax.rsqrt(
            jnp.maximum(jnp.asarray(step, jnp.float32), float(cfg.warmup_steps)))
    decay_steps = max(total_steps - cfg.warmup_steps, 1)
    end = base * cfg.min_lr_ratio
    after = {
        "constant": optax.constant_schedule(base),
        "linear": optax.linear_schedule(base, end, decay_steps),
        "cosine": optax.cosine_decay_schedule(base, decay_steps, alpha=cfg.min_lr_ratio),
    }[cfg.schedule]
    if cfg.warmup_steps > 0:
        warm = optax.linear_schedule(0.0, base, cfg.warmup_steps)
        after = optax.join_schedules([warm, after], [cfg.warmup_steps])
    # The step is taken as float32: optax's cosine schedule mixes an int32 step with Python
    # floats, which strict dtype promotion rejects when it is called outside make_optimizer.
    return lambda step: after(jnp.asarray(step, jnp.float32))


_NO_DECAY_LEAVES = ("b", "bias", "bias_V", "halt_b")


def decay_mask(params):
    """Weight decay on weights only: not on norms (scales and biases, stacked or not) nor on
    biases (BERT / ALBERT practice)."""
    def decay(path, _) -> bool:
        names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
        return not any("norm" in n for n in names) and (not names or names[-1] not in _NO_DECAY_LEAVES)
    return jax.tree_util.tree_map_with_path(decay, params)


def _standard_promotion(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """tx, with init/update traced under jax's standard dtype promotion.

    optax mixes Python floats with the int32 step count (e.g. ``1 - b1 ** count``), which the
    strict promotion mode turned on by the tests (and by careful users) rejects.
    """
    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return tx.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: OptimConfig, total_steps: int, lr=None,
                   weight_decay=None) -> optax.GradientTransformation:
    """cfg's optimizer; lr / weight_decay: in place of cfg's (a trial's values, which may be
    traced arrays: the state's layout does not depend on them)."""
    return _standard_promotion(_make_optimizer(cfg, total_steps, lr, weight_decay))


def _make_optimizer(cfg: OptimConfig, total_steps: int, lr, weight_decay):
    opt = optimizer(cfg.name).build(cfg, schedule(cfg, total_steps, lr), weight_decay,
                                    decay_mask)
    if cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    return opt
