"""Base: the head reads the last layer's output, h = z_L; no parameters are added."""
from jaxtyping import Array

from . import FusionMethod


class Base(FusionMethod):
    NAME, ORDER = "base", 10

    @classmethod
    def build(cls, backbone, n_extra, *, key):
        return cls()

    def __call__(self, z_LBPD: Array) -> Array:
        return z_LBPD[-1]
