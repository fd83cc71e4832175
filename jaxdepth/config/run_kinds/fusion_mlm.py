"""Layer fusion for MLM over any backbone (task.name mlm), on data.corpus or the grammar."""
from . import CORPUS, FROM_PRETRAINED, GRAMMAR, MLM_EXAMPLES
from .fusion_ner import FusionNER


class FusionMLM(FusionNER):
    NAME, ORDER = "mlm", 6  # NER's recipe, frozen backbone's rate included
    READS = (*CORPUS, *GRAMMAR, *MLM_EXAMPLES, *FROM_PRETRAINED, "fusion")
