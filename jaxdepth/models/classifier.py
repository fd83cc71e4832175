"""An encoder of models/act.py with a classification head: on [CLS] for sentence tasks, on
every token for token tasks (grammatical roles). The encoder keeps its halting, so fine-tuning
pays the ponder cost as in pretraining (Simoulin & Crabbe)."""
from __future__ import annotations

import equinox as eqx
import jax
from jaxtyping import Array

from .declared import OverEncoder
from .layers import Dense, dropout, split_or_none


class EncoderClassifier(OverEncoder):
    encoder: eqx.Module  # ACTEncoder or UntiedEncoder
    head: Dense  # d_model -> labels
    token_level: bool = eqx.field(static=True)

    def __init__(self, encoder, n_labels: int, token_level: bool, *, key: Array):
        self.encoder = encoder
        self.head = Dense(encoder.cfg.d_model, n_labels, key=key)
        self.token_level = token_level

    def flops_per_token(self, seq_len: int) -> int:
        return self.encoder.flops_per_token(seq_len)  # the head is left out

    def __call__(self, tokens_BT: Array, segments_BT: Array, mask_BT: Array, *,
                 key: Array | None = None, inference: bool = False):
        """(float32 logits [B, labels] or [B, T, labels], the encoder's ACTOutput).
        `inference` runs the while-loop path of an ACT encoder (cost follows the depth)."""
        k_enc, k_drop = split_or_none(key, 2)
        forward = getattr(self.encoder, "forward_while" if inference else "forward_scan")
        out = forward(tokens_BT, segments_BT, mask_BT, key=k_enc)
        h = out.h_BTD if self.token_level else out.h_BTD[:, 0]
        h = dropout(h, self.encoder.dropout_rate, k_drop)
        return self.head(h).astype(jax.numpy.float32), out
