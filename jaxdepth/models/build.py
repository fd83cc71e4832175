"""The model a Config describes: the decoder LM, an encoder of models/act.py, the BERT encoder
with its MLM head, or (task.name ner / mlm) a backbone with a fusion module and a head."""
from __future__ import annotations

import dataclasses

import jax
from jaxtyping import Array

from ..config import FUSION_TASKS, PROBE_TASKS, ACTConfig, Config


def encoder_config(cfg: Config) -> ACTConfig:
    """cfg.act with the run's vocabulary, and the halting mode model.arch asks for."""
    halting = "fixed" if cfg.model.arch == "albert" else cfg.act.halting
    return dataclasses.replace(cfg.act, vocab_size=cfg.model.vocab_size, halting=halting)


def build_model(cfg: Config, *, key: Array):
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM

    arch = cfg.model.arch
    if cfg.task.name in FUSION_TASKS:
        return _fused(cfg, key)
    if arch == "decoder":
        return DecoderLM(cfg.model, key=key)
    k_enc, k_head = jax.random.split(key)
    if arch == "encoder":
        from .backbone import bert_config
        from .encoder import Encoder
        from .encoder_mlm import EncoderMLM
        return EncoderMLM(Encoder(bert_config(cfg), key=k_enc), key=k_head)
    enc = (UntiedEncoder if arch == "bert" else ACTEncoder)(encoder_config(cfg), key=k_enc)
    if cfg.task.name in PROBE_TASKS:
        from ..data.probing import label_names
        from .classifier import EncoderClassifier
        return EncoderClassifier(enc, len(label_names(cfg.task.name)), cfg.task.name == "roles",
                                 key=k_head)
    return enc


def _fused(cfg: Config, key: Array):
    from ..data.ner import ner_labels
    from .backbone import build_backbone
    from .fused import FusedModel
    k_bb, k_top = jax.random.split(key)
    f = cfg.fusion
    mlm = cfg.task.name == "mlm"
    return FusedModel(build_backbone(cfg, key=k_bb), method=f.method, mode=f.mode,
                      n_labels=0 if mlm else len(ner_labels(cfg.task.dir)), mlm=mlm,
                      n_extra=f.extra_layers, rate=f.dropout, key=k_top)
