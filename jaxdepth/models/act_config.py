"""The act section: the ALBERT-family encoder of model.arch act, albert and bert."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..fields import check_one_of, one_of, require


ADAPTIVE, FIXED = "act", "fixed"  # act.halting's values

# The encoder sizes (``ACTConfig.preset``, the ``act-*`` presets of config/presets.py): (tau, M)
# are the paper's; sizes are small enough for a CPU except base (ALBERT-base width).
ACT_PRESETS: dict[str, dict] = {
    "tiny": dict(tau=1e-3, max_iters=6, d_model=128, n_heads=2),
    "small": dict(tau=5e-4, max_iters=12, d_model=256, n_heads=4),
    "base": dict(tau=2.5e-4, max_iters=24, d_model=768, n_heads=12),
}


@dataclass(frozen=True)
class ACTConfig:
    """The ALBERT-family encoder of model.arch act (adaptive depth, docs/design.md §3),
    albert (the shared layer M times) and bert (M untied layers): its whole description,
    vocabulary included."""
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "embed_dim", "d_model", "n_heads", "d_ff",
                                        "max_len", "n_segments")
    vocab_size: int = 512  # tokenizer pieces = embedding rows
    embed_dim: int = 128  # E, ALBERT's factorised embedding size
    d_model: int = 128  # width of the (shared) layer
    n_heads: int = 2  # attention heads of the layer
    d_ff: int = 0  # 0 -> 4 * d_model
    max_len: int = 128  # positions of the learned position embedding
    n_segments: int = 2  # segment (token type) embeddings: sentences A and B
    max_iters: int = 6  # M: the cap on iterations (ACT), or the depth (fixed, untied)
    tau: float = 1e-3  # ponder-cost weight
    eps: float = 0.01  # a token halts once its cumulative halting probability passes 1 - eps
    dropout: float = 0.0  # dropout rate in the layer and embeddings; 0 off
    # act: each token stops once its halting probability passes 1 - eps, at a ponder cost |
    # fixed: exactly M iterations, no halting (weight-tied ALBERT)
    halting: str = one_of(ADAPTIVE, (ADAPTIVE, FIXED))
    # b_h at init: < 0 starts every token at M (act-cpu); tests and benchmarks also move it
    # to force depths
    halting_bias_init: float = 0.0
    remat: bool = False  # recompute the shared layer on the backward pass instead of storing it

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "d_model", "n_heads", "max_len", "n_segments",
                     "max_iters"):
            v = getattr(self, name)
            require(isinstance(v, int) and v > 0, f"act.{name}",
                    f"must be a positive integer, got {v!r}")
        require(self.d_ff >= 0, "act.d_ff", f"must be >= 0 (0 means 4 * d_model), got {self.d_ff}")
        require(self.d_model % self.n_heads == 0, "act.n_heads",
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        require(self.tau >= 0.0, "act.tau", f"must be >= 0, got {self.tau}")
        require(0.0 < self.eps < 1.0, "act.eps", f"must be in (0, 1), got {self.eps}")
        require(0.0 <= self.dropout < 1.0, "act.dropout", f"must be in [0, 1), got {self.dropout}")
        check_one_of(self, "act")

    @property
    def adaptive(self) -> bool:
        """Whether tokens halt (ACT: the halting recurrence and its ponder cost), or every
        token runs the shared layer max_iters times."""
        return self.halting == ADAPTIVE

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def dims(self) -> tuple:
        """(layers run, d_model, d_ff, heads, remat, loss chunk): trainer/memory.py's inputs.
        Up to max_iters iterations of the shared layer run; the MLM loss is unchunked."""
        return self.max_iters, self.d_model, self.ff, self.n_heads, self.remat, 0

    def shape(self) -> dict[str, int]:
        """The SHAPE fields as the model uses them (d_ff=0 is 4 * d_model)."""
        return {f: self.ff if f == "d_ff" else getattr(self, f) for f in self.SHAPE}

    @classmethod
    def preset(cls, name: str, **overrides) -> "ACTConfig":
        require(name in ACT_PRESETS, "act.preset",
                f"unknown preset {name!r}; known: {sorted(ACT_PRESETS)}")
        return cls(**{**ACT_PRESETS[name], **overrides})
