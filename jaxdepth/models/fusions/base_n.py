"""Base+n: n freshly initialised post-LN layers of the backbone's kind (one stack, scanned)
on z_L. Its layers attend over the sentence, so it reads z_L at every position, not a word's
states alone."""
import equinox as eqx
from jaxtyping import Array

from ..layers import PostLNLayer
from ..stack import folded_keys, init_stack, run_stack
from . import FusionMethod, Sentence


class BasePlusN(FusionMethod):
    NAME, ORDER = "base+n", 20
    INPUT = Sentence
    READS = ("fusion.extra_layers",)  # its n

    layers: PostLNLayer  # every leaf has a leading axis n
    n: int = eqx.field(static=True)

    def __init__(self, n: int, make_layer, *, key: Array):
        """make_layer(key) -> a PostLNLayer; the backbone's ``post_ln_layer``."""
        self.layers = init_stack(lambda k: make_layer(key=k), n, key=key)
        self.n = n

    @classmethod
    def build(cls, backbone, n_extra, *, key):
        return cls(n_extra, backbone.post_ln_layer, key=key)

    def __call__(self, x_BTD: Array, mask_BT: Array, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        h_BTD, _ = run_stack(self.layers, x_BTD, lambda layer, h, k: layer(h, mask_BT, rate, k),
                             keys=folded_keys(key, self.n))
        return h_BTD

    @property
    def attention_layers(self) -> int:
        return self.n

    @classmethod
    def label(cls, n_extra):
        return f"base+{n_extra}"
