"""Base: the head reads the last layer's output, h = z_L; no module is added."""
from . import FusionMethod


class Base(FusionMethod):
    NAME, ORDER = "base", 10

    @classmethod
    def build(cls, backbone, n_extra, *, key):
        return None

    @classmethod
    def fuse(cls, module, z, mask_BT, rate, key):
        return z[-1]

    @classmethod
    def param_count(cls, backbone, n_extra):
        return 0
