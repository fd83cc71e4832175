"""Backbones for layer fusion: what a fusion task stacks its module on (docs/design.md §4).

A backbone is any deep model of this project whose layer outputs ``z_1..z_L`` can be read:

- ``Encoder`` (BERT/RoBERTa; trained here with ``model.arch=encoder`` or imported from a
  Hugging Face directory): its L layer outputs.
- ``ACTEncoder`` / ``UntiedEncoder`` (``act``, ``albert``, ``bert``): the states after each of
  the M iterations (for ACT, a halted token's state stays as it was when it halted).
- ``DecoderLM``: its L layer outputs (causal, before the final norm).

Where a backbone's weights come from (``task.init_from``) is the tasks' business
(``jaxdepth/tasks/backbones.py``).
"""
from __future__ import annotations

import equinox as eqx
from jaxtyping import Array

from ..config import ConfigError
from .encoder import Encoder


def strip_to_backbone(model) -> eqx.Module:
    """The deep part of a trained model: EncoderMLM / EncoderClassifier -> their encoder,
    a fusion model -> its backbone; encoders and decoders are their own backbone."""
    for attr in ("backbone", "encoder"):
        if hasattr(model, attr) and isinstance(getattr(model, attr), eqx.Module):
            return strip_to_backbone(getattr(model, attr))
    return model


def depth_and_width(backbone) -> tuple[int, int]:
    """(L, d): how many layer outputs the backbone yields and their width."""
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM
    if isinstance(backbone, Encoder):
        return backbone.cfg.n_layers, backbone.cfg.d_model
    if isinstance(backbone, (ACTEncoder, UntiedEncoder)):
        return backbone.cfg.max_iters, backbone.cfg.d_model
    if isinstance(backbone, DecoderLM):
        return backbone.cfg.n_layers, backbone.cfg.d_model
    raise ConfigError(f"task.init_from: a {type(backbone).__name__} is not a fusion backbone")


def layer_states(backbone, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 *, key: Array | None = None) -> Array:
    """z_LBTD: the output of every layer (iteration) of the backbone, embeddings excluded."""
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM
    if isinstance(backbone, Encoder):
        return backbone(tokens_BT, mask_BT, segments_BT, key=key)[1]
    if isinstance(backbone, (ACTEncoder, UntiedEncoder)):
        return backbone(tokens_BT, segments_BT, mask_BT, key=key, return_states=True).states_MBTD
    if isinstance(backbone, DecoderLM):
        return backbone.hidden(tokens_BT, key=key, all_layers=True)[1]
    raise TypeError(f"{type(backbone).__name__} is not a fusion backbone")


def backbone_heads(backbone) -> int:
    """Attention heads of the backbone's layers (for Base+n's fresh layers)."""
    c = backbone.cfg
    return c.heads if hasattr(c, "heads") else c.n_heads


