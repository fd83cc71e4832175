"""The model section (``--model.*``): the decoder's and the encoder's shape and options, and
the choice of architecture for every run (``model.arch``); its attention paths and
architectures are the choice tables beside it (attentions.py, archs.py). The run's Config
(jaxdepth/config/) composes it with the other sections."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..fields import positive, require, resumable
from .archs import arch as arch_class, arch_names
from .attentions import attention_names, attention_path


ATTENTIONS = attention_names()  # model.attention: one class each in attentions.py
ARCHS = arch_names()  # model.arch: one class each in archs.py, with the section it reads


@dataclass(frozen=True)
class ModelConfig:
    """The model of model.arch decoder (T5) or encoder (BERT/RoBERTa), and the choice of
    architecture for every run. For act, albert and bert the model is the act section, and
    only model.arch is read here."""
    # Fields that fix parameter shapes (or what the weights mean): a checkpoint only loads into
    # a model that agrees on them. Every other field is a run-time option.
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "d_model", "n_layers", "d_ff", "n_heads",
                                        "rel_buckets", "rel_max_distance")
    vocab_size: int = 512  # tokenizer pieces = embedding rows (a trained tokenizer gets this size)
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # depth (a depth family trades it for d_ff at equal size: Eq. 1)
    d_ff: int = 512  # hidden width of each gated-GELU feed-forward block
    # The decoder computes its feed-forward blocks with d_ff zero-padded up to a multiple of
    # this (Eq. 1's odd widths are slow matmul shapes on a GPU); the weights keep d_ff and the
    # padding is exact. -1: 128 on a GPU/TPU, 1 (no padding) on the CPU
    d_ff_multiple: int = resumable(-1)
    n_heads: int = 0  # 0 -> d_model // 64 (at least 1); d_attn = d_model either way
    rel_buckets: int = 32  # T5 relative-position buckets (all layers)
    # distance beyond which relative positions share a bucket
    rel_max_distance: int = 128
    dropout: float = 0.0  # dropout rate in every layer (decoder / encoder); 0 off
    # weight of the z-loss log(Z)^2 on the output logits; 0 off
    z_loss: float = 0.0
    # parameters stay float32; "bfloat16" computes in bf16
    compute_dtype: str = "float32"
    remat: str = resumable("none")  # none | full | dots (save matmul outputs, recompute the rest)
    scan_layers: bool = resumable(True)  # False runs a Python loop over layers (tests, debugging)
    # layers per scan iteration; 0: all of them up to 2 layers, else 1
    scan_unroll: int = resumable(0)
    # tokens per chunk of the fused output-projection + loss; 0: unfused
    xent_chunk: int = resumable(2048)
    # The decoder's training/eval attention (one class each in models/attentions.py): einsum
    # (our own, the reference) | dot_product (jax.nn.dot_product_attention,
    # implementation=None: XLA's path in jax 0.10) | cudnn (the same call forcing cuDNN's
    # fused flash kernel: GPU only, bf16 compute).
    attention: str = resumable("einsum")
    # decoder | act (ACT encoder) | albert (weight-tied, fixed M) | bert (untied, ALBERT
    # embeddings) | encoder (BERT/RoBERTa of models/encoder.py: MLM pretraining, fusion
    # backbone); one class each in jaxdepth/models/archs.py
    arch: str = "decoder"

    def __post_init__(self):
        positive(self, "model", "vocab_size", "d_model", "n_layers", "d_ff",
                 "rel_buckets", "rel_max_distance")
        require(self.n_heads >= 0, "model.n_heads", f"must be >= 0, got {self.n_heads}")
        require(self.d_model % self.heads == 0, "model.n_heads",
                f"d_model={self.d_model} is not divisible by n_heads={self.heads}")
        require(0.0 <= self.dropout < 1.0, "model.dropout",
                f"must be in [0, 1), got {self.dropout}")
        require(self.z_loss >= 0.0, "model.z_loss", f"must be >= 0, got {self.z_loss}")
        require(self.compute_dtype in ("float32", "bfloat16"), "model.compute_dtype",
                f"must be float32 or bfloat16, got {self.compute_dtype!r}")
        require(self.remat in ("none", "full", "dots"), "model.remat",
                f"must be none, full or dots, got {self.remat!r}")
        require(self.scan_unroll >= 0, "model.scan_unroll", "must be >= 0")
        require(self.d_ff_multiple == -1 or self.d_ff_multiple > 0, "model.d_ff_multiple",
                f"must be -1 or positive, got {self.d_ff_multiple}")
        require(self.xent_chunk >= 0, "model.xent_chunk", "must be >= 0")
        attention_path(self.attention).check(self)  # ConfigErrors naming model.attention
        arch_class(self.arch)  # a ConfigError naming model.arch

    @property
    def heads(self) -> int:
        return self.n_heads or max(1, self.d_model // 64)

    def shape(self) -> dict[str, int]:
        """The SHAPE fields as the model uses them (n_heads=0, automatic, is the derived
        count), so two configs of one shape compare equal however they spell it."""
        return {f: self.heads if f == "n_heads" else getattr(self, f) for f in self.SHAPE}

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def dims(self) -> tuple:
        """(layers run, d_model, d_ff, heads, remat, loss chunk): trainer/memory.py's inputs."""
        return self.n_layers, self.d_model, self.d_ff, self.heads, self.remat, self.xent_chunk


