"""Layer fusion for MLM over any backbone (task.name mlm), on data.corpus or the grammar."""
from .fusion_ner import FusionNER


class FusionMLM(FusionNER):
    NAME, TASK = "mlm", "mlm:FusionMLMTask"  # NER's recipe, frozen backbone's rate included
