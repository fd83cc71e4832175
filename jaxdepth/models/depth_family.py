"""Eq. 1 of Petty et al.: depth families of equal size. Each member trades layers for
feed-forward width around a baseline (n0 layers, d_ff0), so that every member has the
baseline's parameter count up to rounding; the size classes (Table 1, and two CPU-scale ones)
and the decoder's analytic parameter count."""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..errors import ConfigError
from .config import ModelConfig


def layer_constants(d_model: int, d_attn: int | None = None) -> tuple[int, int]:
    """(beta, A): one gated-GELU layer has beta * d_ff + A parameters."""
    d_attn = d_model if d_attn is None else d_attn
    return 3 * d_model, 4 * d_model * d_attn + 2 * d_model


def depth_family_dff(d_model: int, n0: int, d_ff0: int, n_layers: int) -> int:
    """d_ff of the n_layers member of the family around baseline (n0, d_ff0) (Petty et al., Eq. 1).

    w(k) = round((1 - n0 / (n0 + k)) * (d_ff0 + A / beta)), round half to even, computed in
    exact rationals so the rounding of .5 cases is not at the mercy of floating point.
    """
    if n_layers <= 0:
        raise ConfigError(f"model.n_layers: must be positive, got {n_layers}",
                          field="model.n_layers")
    beta, a = layer_constants(d_model)
    k = n_layers - n0
    w = round((1 - Fraction(n0, n0 + k)) * (d_ff0 + Fraction(a, beta)))
    d_ff = d_ff0 - w
    if d_ff < 1:
        raise ConfigError(f"model.d_ff: Eq. 1 gives d_ff={d_ff} for n_layers={n_layers} around "
                          f"baseline ({n0} layers, d_ff {d_ff0}, d_model {d_model}): too deep "
                          f"for this size", field="model.d_ff")
    return d_ff


@dataclass(frozen=True)
class SizeClass:
    name: str
    d_model: int
    n0: int
    d_ff0: int
    depths: tuple[int, ...]
    vocab_size: int


SIZE_CLASSES = {
    c.name: c for c in (
        SizeClass("41M", 512, 2, 2048, (1, 2, 3, 4, 5, 6, 7), 32128),
        SizeClass("134M", 768, 12, 2048, (1, 2, 4, 6, 8, 12, 16, 21, 26, 32), 32128),
        SizeClass("374M", 1024, 24, 2816, (1, 2, 4, 6, 8, 12, 16, 24, 32), 32128),
        # CPU-scale classes built by the same rule: members train in minutes on two cores.
        SizeClass("tiny", 64, 2, 256, (1, 2, 3, 4, 6), 512),
        SizeClass("small", 128, 4, 512, (1, 2, 3, 4, 6, 8), 512),
    )
}


def depth_family(size_class: str) -> dict[int, ModelConfig]:
    """Every member of a size class: n_layers -> ModelConfig with d_ff from Eq. 1."""
    if size_class not in SIZE_CLASSES:
        raise ConfigError(f"preset: unknown size class {size_class!r}; known: "
                          f"{sorted(SIZE_CLASSES)}", field="preset")
    c = SIZE_CLASSES[size_class]
    return {n: ModelConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=n,
                           d_ff=depth_family_dff(c.d_model, c.n0, c.d_ff0, n))
            for n in c.depths}


def param_count(m: ModelConfig) -> int:
    """Analytic parameter count of models.decoder.DecoderLM built from m."""
    beta, a = layer_constants(m.d_model)
    embeddings = 2 * m.d_model * m.vocab_size  # untied input embedding and output projection
    return m.n_layers * (beta * m.d_ff + a) + embeddings + m.d_model + m.rel_buckets * m.heads
