"""Lion (Chen et al. 2023): u = sign(b1 m + (1 - b1) g), then m <- b2 m + (1 - b2) g, with
decoupled weight decay. Every coordinate moves by the learning rate, so Lion's rate is 3-10x
smaller than AdamW's and its weight decay as much larger (the paper's advice); no eps."""
import optax

from . import Optimizer


class Lion(Optimizer):
    NAME, DEFAULTS, OPTAX = "lion", {"b1": 0.9, "b2": 0.99}, optax.lion
