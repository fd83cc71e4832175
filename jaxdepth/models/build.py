"""The model a Config describes: the decoder LM, or one of the encoders of models/act.py."""
from __future__ import annotations

import dataclasses

import jax
from jaxtyping import Array

from ..config import PROBE_TASKS, ACTConfig, Config


def encoder_config(cfg: Config) -> ACTConfig:
    """cfg.act with the run's vocabulary, and the halting mode model.arch asks for."""
    halting = "fixed" if cfg.model.arch == "albert" else cfg.act.halting
    return dataclasses.replace(cfg.act, vocab_size=cfg.model.vocab_size, halting=halting)


def build_model(cfg: Config, *, key: Array):
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM

    arch = cfg.model.arch
    if arch == "decoder":
        return DecoderLM(cfg.model, key=key)
    k_enc, k_head = jax.random.split(key)
    enc = (UntiedEncoder if arch == "bert" else ACTEncoder)(encoder_config(cfg), key=k_enc)
    if cfg.task.name in PROBE_TASKS:
        from ..data.probing import label_names
        from .classifier import EncoderClassifier
        return EncoderClassifier(enc, len(label_names(cfg.task.name)), cfg.task.name == "roles",
                                 key=k_head)
    return enc
