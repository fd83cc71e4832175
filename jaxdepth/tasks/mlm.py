"""Masked-LM training of the BERT encoder (``model.arch=encoder``, task empty) and MLM with a
fusion module over a backbone (``task.name=mlm``, docs/design.md §4), on the MLM data of
data/corpus/mlm_sop.py (the embedded grammar, WikiText-2 or text / JSONL files; ALBERT-style n-gram
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
from ..models.specs import EncoderConfig
from ..data.corpus.prepare import tokenizer_source
from ..data.corpus.subwords import HFWords
from ..models.encoder import Encoder, EncoderMLM
from .losses import batch_totals, weighted_xent_sum
from .eval_request import EvalRequest, load_checkpoint, scored_on
from ..config.run_kinds.bert_mlm_pretraining import BertMLMPretraining
from ..config.run_kinds.fusion_mlm import FusionMLM
from .backbones import FusionTask, backbone_vocab, is_hf_dir
from .encoder_pretrain import MLMCorpus, MLMPrepared, mlm_config, read_mlm_corpus
from .lm import write_json


def mlm_objective():
    def objective(model, mb, key, totals):
        logits = model.masked_logits(mb["tokens"], mb["segments"], mb["mask"],
                                     mb["mlm_positions"], key=key)
        mlm = weighted_xent_sum(logits, mb["mlm_ids"], mb["mlm_weights"]) / totals["predictions"]
        return mlm, {"loss": mlm, "tokens": jnp.sum(mb["mask"].astype(jnp.float32))}

    return objective, batch_totals("predictions")


@eqx.filter_jit
def _eval_sums(model, batch):
    logits = model.masked_logits(batch["tokens"], batch["segments"], batch["mask"],
                                 batch["mlm_positions"])
    w = batch["mlm_weights"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["mlm_ids"]).astype(jnp.float32)
    return weighted_xent_sum(logits, batch["mlm_ids"], w), jnp.sum(w * correct), jnp.sum(w)


def mlm_perplexity(model, batches) -> dict:
    """Held-out MLM loss, accuracy and perplexity over the masked slots of `batches`."""
    sums = jax.device_get([_eval_sums(model, b) for b in batches])
    nll, correct, n = (sum(float(s[i]) for s in sums) for i in range(3))
    loss = nll / max(n, 1.0)
    return {"mlm_loss": loss, "mlm_accuracy": correct / max(n, 1.0),
            "mlm_perplexity": math.exp(min(loss, 80.0)), "mlm_predictions": n}


def bert_config(cfg: Config) -> EncoderConfig:
    """The own encoder (model.arch=encoder) from the model section; positions = data.seq_len."""
    m = cfg.model
    return EncoderConfig(vocab_size=m.vocab_size, d_model=m.d_model, n_layers=m.n_layers,
                         n_heads=m.heads, d_ff=m.d_ff, max_positions=cfg.data.seq_len,
                         dropout=m.dropout, scan_layers=m.scan_layers, remat=m.remat != "none")


class MLMTask(MLMCorpus):
    """Masked-LM training on data.corpus, scored by held-out perplexity."""

    def objective(self):
        return mlm_objective()

    def evaluate(self, models, tasks, step: int, sharding, final: bool) -> list:
        out = []
        for k, t in enumerate(tasks):
            res = mlm_perplexity(models.one(k), t.prepared.valid)
            out.append((res, f"MLM loss {res['mlm_loss']:.4f}, accuracy "
                             f"{res['mlm_accuracy']:.4f}, perplexity {res['mlm_perplexity']:.3f}"))
        return out

    EVAL_READS = frozenset({"step", "data", "batch", "out"})

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """Held-out MLM perplexity of the checkpoint, on the run's validation batches or MLM
        batches of --data files."""
        cfg, model, step, _, _ = load_checkpoint(run, request.step, request.batch, tokenizer=False)
        cfg = scored_on(cfg, request)
        valid = type(self)(cfg).read_data(run, primary=False, barrier=lambda: None).valid
        out = {"run": str(run), "step": step,
               "data": request.data or "validation batches of the run",
               **mlm_perplexity(model, valid)}
        write_json(Path(request.out or run / f"eval_step{step}.json"), out)
        return out


class EncoderMLMTask(MLMTask):
    """MLM pretraining of the BERT encoder (model.arch=encoder): a fusion backbone."""
    RUNS = BertMLMPretraining

    def build_model(self, *, key):
        k_enc, k_head = jax.random.split(key)
        return EncoderMLM(Encoder(bert_config(self.cfg), key=k_enc), key=k_head)

    def summary(self, model) -> dict:
        return {"task": "", "arch": self.cfg.model.arch}


class FusionMLMTask(FusionTask, MLMTask):
    """MLM through a fusion module over a backbone (task.name=mlm)."""
    RUNS = FusionMLM

    def read_data(self, run_dir: Path, primary: bool, barrier) -> MLMPrepared:
        cfg = self.cfg
        src = cfg.task.init_from
        mlm, tokenizer = mlm_config(cfg), None
        if src and is_hf_dir(src):  # its tokenizer.json, special ids and word boundaries
            tokenizer = HFWords(src)
            mlm = dataclasses.replace(mlm, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id,
                                      mask_id=tokenizer.mask_id,
                                      first_random_id=tokenizer.first_random_id)
        return read_mlm_corpus(cfg, run_dir, primary, barrier, mlm, backbone_vocab(cfg),
                               tokenizer=tokenizer,
                               copy_from=tokenizer_source(src, cfg.data.tokenizer))

    def summary(self, model) -> dict:
        c = self.cfg
        return {"task": "mlm", "arch": c.model.arch, "method": c.fusion.method,
                "mode": c.fusion.mode, "init_from": c.task.init_from, "init_step": self.init_step}
