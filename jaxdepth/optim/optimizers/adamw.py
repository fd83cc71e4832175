"""AdamW (Loshchilov & Hutter): Adam with weight decay decoupled from the gradient."""
import optax

from . import Optimizer


class AdamW(Optimizer):
    NAME, DEFAULTS, OPTAX = "adamw", {"b1": 0.9, "b2": 0.999, "eps": 1e-8}, optax.adamw
