"""The model specs: not command-line sections but what the model and data modules are built
from. The tasks derive them from config.py's sections (tasks/mlm.py:bert_config,
tasks/encoder_pretrain.py:mlm_config), and models/hf_import.py reads an EncoderConfig from a
Hugging Face config.json."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..fields import require
from .token_ids import CLS_ID, MASK_ID, N_SPECIAL, SEP_ID

ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "relu")  # models/layers.py:activation_fn

@dataclass(frozen=True)
class EncoderConfig:
    """The BERT/RoBERTa encoder of models/encoder.py (model.arch=encoder, or a Hugging Face
    checkpoint)."""
    # Fields that fix parameter shapes; every other field is a run-time option or read from a
    # checkpoint's config.
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff",
                                        "max_positions", "type_vocab_size")
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_offset: int = 0  # RoBERTa: pad_id + 1 (= 2); BERT: 0
    pad_id: int = 0
    dropout: float = 0.1
    activation: str = "gelu"  # exact erf GELU (HF "gelu"); "gelu_new"/"gelu_tanh": tanh approx
    scan_layers: bool = True  # run-time option: lax.scan over the stacked layers, or unrolled
    remat: bool = False  # run-time option: rematerialise each layer in the backward pass

    def __post_init__(self):
        def check(cond: bool, name: str, msg: str) -> None:
            require(cond, f"EncoderConfig.{name}", msg)

        for name in self.SHAPE:
            v = getattr(self, name)
            check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name,
                  f"must be a positive int, got {v!r}")
        check(self.d_model % self.n_heads == 0, "n_heads",
              f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        check(self.layer_norm_eps > 0, "layer_norm_eps", f"must be > 0, got {self.layer_norm_eps}")
        check(isinstance(self.position_offset, int) and self.position_offset >= 0,
              "position_offset", f"must be an int >= 0, got {self.position_offset!r}")
        check(self.position_offset < self.max_positions, "position_offset",
              f"{self.position_offset} leaves no positions (max_positions={self.max_positions})")
        check(isinstance(self.pad_id, int) and 0 <= self.pad_id < self.vocab_size, "pad_id",
              f"must be in [0, vocab_size), got {self.pad_id!r}")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        check(self.activation in ACTIVATIONS, "activation",
              f"must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def max_len(self) -> int:
        """Longest sequence the position table allows."""
        return self.max_positions - self.position_offset

    def shape(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.SHAPE}


@dataclass(frozen=True)
class MLMConfig:
    """How data/corpus/mlm_sop.py makes ALBERT-style MLM + SOP examples."""
    seq_len: int = 128
    mask_rate: float = 0.15
    max_predictions: int = 20
    max_ngram: int = 3
    p_mask: float = 0.8
    p_random: float = 0.1  # the rest (1 - p_mask - p_random) is kept
    short_seq_prob: float = 0.1
    sop: bool = True
    # The tokenizer's special ids and the first id drawn as a random replacement (defaults:
    # this project's SentencePiece layout; a Hugging Face WordPiece/BPE vocabulary differs).
    cls_id: int = CLS_ID
    sep_id: int = SEP_ID
    mask_id: int = MASK_ID
    first_random_id: int = N_SPECIAL

    def __post_init__(self):
        def check(cond: bool, name: str, why: str) -> None:
            require(cond, f"MLMConfig.{name}", f"{why}, got {getattr(self, name)!r}")

        def integer(v) -> bool:
            return not isinstance(v, bool) and isinstance(v, (int, np.integer))

        for f in ("seq_len", "max_predictions", "max_ngram"):
            check(integer(getattr(self, f)), f, "must be an integer")
        for f in ("mask_rate", "p_mask", "p_random", "short_seq_prob"):
            v = getattr(self, f)
            check(not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer))
                  and bool(np.isfinite(v)), f, "must be a finite number")
        check(isinstance(self.sop, (bool, np.bool_)), "sop", "must be a bool")
        check(self.seq_len >= 5, "seq_len",
              "must be >= 5 ([CLS] A [SEP] B [SEP] with non-empty A and B)")
        check(0 < self.mask_rate <= 1, "mask_rate", "must be in (0, 1]")
        check(self.max_predictions >= 1, "max_predictions", "must be >= 1")
        check(self.max_ngram >= 1, "max_ngram", "must be >= 1")
        check(0 <= self.p_mask <= 1, "p_mask", "must be in [0, 1]")
        check(0 <= self.p_random <= 1, "p_random", "must be in [0, 1]")
        check(self.p_mask + self.p_random <= 1 + 1e-12, "p_random",
              f"p_mask + p_random = {self.p_mask + self.p_random} exceeds 1")
        check(0 <= self.short_seq_prob <= 1, "short_seq_prob", "must be in [0, 1]")
        for f in ("cls_id", "sep_id", "mask_id", "first_random_id"):
            check(isinstance(getattr(self, f), (int, np.integer)) and getattr(self, f) >= 0, f,
                  "must be an integer >= 0")
