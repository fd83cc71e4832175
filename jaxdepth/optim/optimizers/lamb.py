"""LAMB (You et al.): Adam's update scaled per layer by the trust ratio ||w|| / ||update||, as
ALBERT (and so Simoulin & Crabbe) pretrain with."""
import optax

from . import Optimizer


class Lamb(Optimizer):
    NAME, DEFAULTS, OPTAX = "lamb", {"b1": 0.9, "b2": 0.999, "eps": 1e-6}, optax.lamb
