"""The model specs: not command-line sections but what the model and data modules are built
from. The tasks derive them from config.py's sections (tasks/mlm.py:bert_config,
tasks/encoder_pretrain.py:mlm_config), and models/hf_import.py reads an EncoderConfig from a
Hugging Face config.json."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

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
        for name in self.SHAPE:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"EncoderConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"EncoderConfig.d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"EncoderConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not isinstance(self.position_offset, int) or self.position_offset < 0:
            raise ValueError(f"EncoderConfig.position_offset must be an int >= 0, "
                             f"got {self.position_offset!r}")
        if self.position_offset >= self.max_positions:
            raise ValueError(f"EncoderConfig.position_offset={self.position_offset} leaves no "
                             f"positions (max_positions={self.max_positions})")
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"EncoderConfig.pad_id must be in [0, vocab_size), got {self.pad_id!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"EncoderConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"EncoderConfig.activation must be one of {ACTIVATIONS}, "
                             f"got {self.activation!r}")

    @property
    def max_len(self) -> int:
        """Longest sequence the position table allows."""
        return self.max_positions - self.position_offset

    def shape(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.SHAPE}

    def replace(self, **changes) -> "EncoderConfig":
        return dataclasses.replace(self, **changes)


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
        def bad(field, why):
            raise ValueError(f"MLMConfig.{field}={getattr(self, field)!r}: {why}")

        for f in ("seq_len", "max_predictions", "max_ngram"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                bad(f, "must be an integer")
        for f in ("mask_rate", "p_mask", "p_random", "short_seq_prob"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                    or not np.isfinite(v):
                bad(f, "must be a finite number")
        if not isinstance(self.sop, (bool, np.bool_)):
            bad("sop", "must be a bool")
        if self.seq_len < 5:
            bad("seq_len", "must be >= 5 ([CLS] A [SEP] B [SEP] with non-empty A and B)")
        if not 0 < self.mask_rate <= 1:
            bad("mask_rate", "must be in (0, 1]")
        if self.max_predictions < 1:
            bad("max_predictions", "must be >= 1")
        if self.max_ngram < 1:
            bad("max_ngram", "must be >= 1")
        if not 0 <= self.p_mask <= 1:
            bad("p_mask", "must be in [0, 1]")
        if not 0 <= self.p_random <= 1:
            bad("p_random", "must be in [0, 1]")
        if self.p_mask + self.p_random > 1 + 1e-12:
            bad("p_random", f"p_mask + p_random = {self.p_mask + self.p_random} exceeds 1")
        if not 0 <= self.short_seq_prob <= 1:
            bad("short_seq_prob", "must be in [0, 1]")
        for f in ("cls_id", "sep_id", "mask_id", "first_random_id"):
            if not isinstance(getattr(self, f), (int, np.integer)) or getattr(self, f) < 0:
                bad(f, "must be an integer >= 0")

