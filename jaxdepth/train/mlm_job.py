"""Masked-LM training of the BERT encoder (``model.arch=encoder``, task empty) and MLM with a
fusion module over a backbone (``task.name=mlm``, DESIGN section 4), on the MLM data of
data/mlm.py (the embedded grammar, WikiText-2 or text / JSONL files; ALBERT-style n-gram
masking; the sentence-order label is not used).

Objective: the cross-entropy over the global batch's masked slots (their mean). Evaluation: on
fixed held-out batches (seeded apart from training), MLM accuracy and perplexity =
exp(mean cross-entropy over the masked slots).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp


from ..config import Config
from ..data.prepare import tokenizer_source
from ..data.subwords import HFWords
from ..models.act import _xent
from ..models.backbone import is_hf_dir
from .backbone_init import backbone_vocab, initial_fused_model
from .encoder_job import MLMCorpus, mlm_config


def mlm_objective():
    def objective(model, mb, key, totals):
        logits = model.masked_logits(mb["tokens"], mb["segments"], mb["mask"],
                                     mb["mlm_positions"], key=key)
        w = mb["mlm_weights"].astype(jnp.float32)
        mlm = jnp.sum(w * _xent(logits, mb["mlm_ids"])) / totals["predictions"]
        return mlm, {"loss": mlm, "tokens": jnp.sum(mb["mask"].astype(jnp.float32))}

    def totals(batch):
        return {"predictions": jnp.maximum(jnp.sum(batch["mlm_weights"].astype(jnp.float32)), 1.0)}

    return objective, totals


@eqx.filter_jit
def _eval_sums(model, batch):
    logits = model.masked_logits(batch["tokens"], batch["segments"], batch["mask"],
                                 batch["mlm_positions"])
    w = batch["mlm_weights"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["mlm_ids"]).astype(jnp.float32)
    return jnp.sum(w * _xent(logits, batch["mlm_ids"])), jnp.sum(w * correct), jnp.sum(w)


def mlm_perplexity(model, batches) -> dict:
    """Held-out MLM loss, accuracy and perplexity over the masked slots of `batches`."""
    sums = jax.device_get([_eval_sums(model, b) for b in batches])
    nll, correct, n = (sum(float(s[i]) for s in sums) for i in range(3))
    loss = nll / max(n, 1.0)
    return {"mlm_loss": loss, "mlm_accuracy": correct / max(n, 1.0),
            "mlm_perplexity": math.exp(min(loss, 80.0)), "mlm_predictions": n}


class MLMJob(MLMCorpus):
    def __init__(self, cfg: Config, run_dir: Path, primary: bool, barrier):
        self.fusion = cfg.task.name == "mlm"
        src = cfg.task.init_from if self.fusion else ""
        vocab = backbone_vocab(cfg) if self.fusion else cfg.model.vocab_size
        mlm, tokenizer = mlm_config(cfg), None
        if src and is_hf_dir(src):  # its tokenizer.json, special ids and word boundaries
            tokenizer = HFWords(src)
            mlm = dataclasses.replace(mlm, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                                      mask_id=tokenizer.mask_id,
                                      first_random_id=tokenizer.first_random_id)
        super().__init__(cfg, run_dir, primary, barrier, mlm, vocab, tokenizer=tokenizer,
                         copy_from=tokenizer_source(src, cfg.data.tokenizer))
        self.init_step = None

    def objective(self):
        return mlm_objective()

    def initial_model(self, mesh, fresh):
        if not self.fusion:
            return None
        model, self.init_step = initial_fused_model(self.cfg, mesh, fresh)
        return model

    def evaluate(self, model, step: int, sharding, final: bool) -> tuple[dict, str]:
        res = mlm_perplexity(model, self.valid)
        return res, (f"MLM loss {res['mlm_loss']:.4f}, accuracy {res['mlm_accuracy']:.4f}, "
                     f"perplexity {res['mlm_perplexity']:.3f}")

    def summary(self, model) -> dict:
        out = {"task": "mlm" if self.fusion else "", "arch": self.cfg.model.arch}
        if self.fusion:
            out.update(method=self.cfg.fusion.method, mode=self.cfg.fusion.mode,
                       init_from=self.cfg.task.init_from, init_step=self.init_step)
        return out


