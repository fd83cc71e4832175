"""DWAtt: depth-wise attention of each position over its own L layer outputs
(models/fusion.py:DWAtt)."""
from ..fusion import DWAtt
from . import FusionMethod


class DWAttFusion(FusionMethod):
    NAME, LABEL, ORDER = "dwatt", "dwatt", 40

    @classmethod
    def build(cls, backbone, n_extra, *, key):
        return DWAtt(backbone.n_layer_states, backbone.width, key=key)
