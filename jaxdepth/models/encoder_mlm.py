"""MLM on top of the BERT/RoBERTa encoder of models/encoder.py (HF ``BertForMaskedLM`` layout).

The head is BERT's ``cls.predictions`` (models/layers.py): dense d -> d, activation, LayerNorm,
then the output projection tied to the word embeddings plus a vocabulary bias. Logits are taken
only at the masked positions (``positions_BP``), as ALBERT's data pipeline supplies them
(data/corpus/mlm_sop.py), so the vocabulary projection costs P rather than T rows per sequence.
"""
from __future__ import annotations

from jaxtyping import Array

from .specs import EncoderConfig
from .declared import OverEncoder
from .encoder import Encoder, norm_and_activation
from .flops import module_flops
from .layers import MLMHead, gather_positions


def bert_mlm_head(cfg: EncoderConfig, *, key: Array) -> MLMHead:
    """A fresh BERT MLM head (cls.predictions) for an encoder of this config."""
    return MLMHead(cfg.d_model, cfg.d_model, cfg.vocab_size, **norm_and_activation(cfg), key=key)


class EncoderMLM(OverEncoder):
    """The model ``model.arch=encoder`` pretrains: Encoder + tied MLM head (no SOP/NSP head)."""

    encoder: Encoder
    head: MLMHead

    def __init__(self, encoder: Encoder, *, key: Array):
        self.encoder = encoder
        self.head = bert_mlm_head(encoder.cfg, key=key)

    def flops_per_token(self, seq_len: int) -> int:
        return module_flops(self, seq_len)

    def masked_logits(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array, *, key: Array | None = None) -> Array:
        h_BTD, _ = self.encoder.forward(tokens_BT, segments_BT, mask_BT, key=key, all_layers=False)
        return self.head(gather_positions(h_BTD, positions_BP), self.encoder.embed.word_VD)
