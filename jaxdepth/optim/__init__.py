"""The optimizer of a config's optim section: its class (optimizers.py), with the
learning-rate schedule (schedules.py), the weight-decay mask and global-norm clipping around
it. Nothing here imports the config (config/optim.py validates against this package)."""
from __future__ import annotations

import jax
import optax

from .optimizers import optimizer
from .schedules import schedule_class


def schedule(cfg, total_steps: int, lr=None) -> optax.Schedule:
    """Learning rate as a function of the optimizer step: cfg's schedule class
    (schedules.py); lr: in place of cfg.lr, e.g. a trial's, traced under vmap
    (trainer/trials.py)."""
    return schedule_class(cfg.schedule).build(cfg, total_steps, cfg.lr if lr is None else lr)


def decay_mask(params):
    """Whether weight decay applies to each parameter, as the model declares it where the
    parameter is created (models/declared.py): not on norm scales and biases nor on biases
    (BERT / ALBERT practice)."""
    return params.decay_mask()


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


def make_optimizer(cfg, total_steps: int, lr=None,
                   weight_decay=None) -> optax.GradientTransformation:
    """cfg's optimizer; lr / weight_decay: in place of cfg's (a trial's values, which may be
    traced arrays: the state's layout does not depend on them)."""
    return _standard_promotion(_make_optimizer(cfg, total_steps, lr, weight_decay))


def _make_optimizer(cfg, total_steps: int, lr, weight_decay):
    opt = optimizer(cfg.name).build(cfg, schedule(cfg, total_steps, lr), weight_decay,
                                    decay_mask)
    if cfg.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)
    return opt
