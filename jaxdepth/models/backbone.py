"""Backbones for layer fusion (docs/design.md §4): any deep model of this project whose layer
outputs ``z_1..z_L`` a fusion task can read: ``Encoder`` (BERT/RoBERTa, trained here or
imported from Hugging Face), ``ACTEncoder`` / ``UntiedEncoder`` (the states after each of the M
iterations; a halted token's stays as it was) and ``DecoderLM`` (causal, before the final
norm). Where a backbone's weights come from (``task.init_from``) is jaxdepth/tasks/backbones.py's.
"""
from __future__ import annotations

import abc
import copy
import dataclasses
from typing import Any

import equinox as eqx
from jaxtyping import Array

from ..errors import ConfigError
from .trial_tracing import setting
from .declared import Declared
from .layers import PostLNLayer


class Backbone(Declared):
    """What a fusion model (models/fused.py) needs of the deep model under it. Its sizes are
    read from the model's ``cfg`` (``n_layers``, ``d_model``, ``dropout``) unless a subclass
    says otherwise."""

    cfg: eqx.AbstractVar[Any]
    # The setting whose per-trial value replaces cfg.dropout inside a trial step
    # (trial_tracing.setting); None where the rate is not a trial setting (a BERT's config is its
    # checkpoint's as often as the model section's).
    dropout_setting = None
    # Config fields that fix parameter shapes in this model only, besides its cfg.shape()
    _extra_shape_fields = ()

    def with_options(self, **changes):
        """A copy sharing its weights whose static ``cfg`` has ``changes`` applied: run-time
        options only (remat, dtype, dropout, scan layout...); changing a field of
        ``cfg.shape()`` (or ``_extra_shape_fields``) is an error, since the weights would not
        fit."""
        cfg = dataclasses.replace(self.cfg, **changes)

        def shape(c) -> dict:
            return {**c.shape(), **{f: getattr(c, f) for f in self._extra_shape_fields}}

        before, after = shape(self.cfg), shape(cfg)
        changed = [f for f in before if after[f] != before[f]]
        if changed:
            raise ValueError(f"with_options cannot change parameter shapes ({', '.join(changed)})")
        out = copy.copy(self)
        object.__setattr__(out, "cfg", cfg)  # cfg is a static field of a frozen eqx.Module
        return out

    @property
    def n_layer_states(self) -> int:
        """L: how many layer outputs ``layer_states`` returns."""
        return self.cfg.n_layers

    @property
    def width(self) -> int:
        """d: the width of every layer output."""
        return self.cfg.d_model

    @property
    def dropout_rate(self) -> float:
        """Its hidden dropout rate (a trial's traced one inside a trial step), which Base+n's
        fresh layers train with too."""
        return setting(self.dropout_setting, self.cfg.dropout)

    @property
    def uses_dropout(self) -> bool:
        """Whether its training draws dropout keys: a rate above 0."""
        return self.cfg.dropout > 0

    @abc.abstractmethod
    def layer_states(self, tokens_BT: Array, segments_BT: Array | None = None,
                     mask_BT: Array | None = None, *, key: Array | None = None) -> Array:
        """z_LBTD: the output of every layer (iteration), embeddings excluded. Dropout is
        active iff a key is given."""

    @abc.abstractmethod
    def post_ln_layer(self, *, key: Array) -> PostLNLayer:
        """A freshly initialised post-LN layer of its width and heads (Base+n stacks n)."""


def strip_to_backbone(model) -> eqx.Module:
    """The deep part of a trained model: EncoderMLM / EncoderClassifier -> their encoder,
    a fusion model -> its backbone; encoders and decoders are their own backbone."""
    for attr in ("backbone", "encoder"):
        if hasattr(model, attr) and isinstance(getattr(model, attr), eqx.Module):
            return strip_to_backbone(getattr(model, attr))
    return model


def depth_and_width(backbone: Backbone) -> tuple[int, int]:
    """(L, d): how many layer outputs the backbone yields and their width."""
    if not isinstance(backbone, Backbone):
        raise ConfigError(f"task.init_from: a {type(backbone).__name__} is not a fusion backbone")
    return backbone.n_layer_states, backbone.width
