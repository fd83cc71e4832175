"""Concat: one affine map from the L*d concatenation of the layer outputs to d
(models/fusion.py:Concat)."""
from ..fusion import Concat
from . import FusionMethod


class ConcatFusion(FusionMethod):
    NAME, LABEL, ORDER = "concat", "concat", 30

    @classmethod
    def build(cls, backbone, n_extra, *, key):
        return Concat(backbone.n_layer_states, backbone.width, key=key)
