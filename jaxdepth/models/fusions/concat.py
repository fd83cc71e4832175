"""Concat: one affine map from the L*d concatenation of the layer outputs to d."""
from ..fusion import Concat
from . import FusionMethod


class ConcatFusion(FusionMethod):
    NAME, ORDER, MODULE = "concat", 30, Concat
