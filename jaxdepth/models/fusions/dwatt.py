"""DWAtt: depth-wise attention of each position over its own L layer outputs."""
from ..fusion import DWAtt
from . import FusionMethod


class DWAttFusion(FusionMethod):
    NAME, ORDER, MODULE = "dwatt", 40, DWAtt
