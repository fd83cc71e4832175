"""t5x's inverse square root, ``rate / sqrt(max(step, warmup_steps))``: the max() is its
warmup (with rate 1 and 10k steps, 0.01 for 10k steps, then decaying); min_lr_ratio unused."""
import jax
import jax.numpy as jnp

from ...errors import ConfigError
from . import Schedule


class Rsqrt(Schedule):
    NAME = "rsqrt"

    @classmethod
    def build(cls, cfg, total_steps, rate):
        return lambda step: rate * jax.lax.rsqrt(
            jnp.maximum(jnp.asarray(step, jnp.float32), float(cfg.warmup_steps)))

    @classmethod
    def check(cls, cfg):
        if cfg.warmup_steps <= 0:
            raise ConfigError("optim.warmup_steps: rsqrt needs warmup_steps > 0 (t5x uses "
                              "10000)", field="optim.warmup_steps")
