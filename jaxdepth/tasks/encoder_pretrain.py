"""MLM + SOP pretraining of the encoders of models/act.py (ACT, weight-tied ALBERT, untied
BERT) through the same loop, checkpoints and sharding as the decoder (docs/design.md §3).

Objective (ALBERT, plus Graves' ponder cost for ACT): the MLM cross-entropy averaged over the
global batch's prediction slots, the SOP cross-entropy averaged over its rows, and
tau * mean over rows of sum_t mask_t (N_t + R_t). Evaluation at each evaluation point: the
paper's Table 1 statistics (MLM / SOP accuracy, mean iterations per token group) and the
cosine similarity between consecutive iteration states (Fig. 2) on fixed validation batches;
the last one is also written to ``<run>/analysis/``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grain
import jax
import jax.numpy as jnp

from ..analysis.act_stats import (evaluate_act, evaluate_act_each, plot_cosine, write_cosine_table,
                                  write_table1)
from ..config import Config, ConfigError
from ..models.specs import MLMConfig
from ..data.embedded import grammar
from ..data.corpus.mlm_sop import (eval_mlm_batches, grammar_documents, mlm_dataset,
                                   text_documents, tokenize_mlm_documents)
from ..data.corpus.pipeline import split_documents
from ..data.corpus.prepare import corpus_name, run_tokenizer, tokenizer_source
from ..errors import writing_result
from ..models.act import ACTEncoder, UntiedEncoder
from ..models.layers import split_or_none
from .losses import batch_totals, softmax_xent as _xent, weighted_xent_sum
from .eval_request import EvalRequest, load_checkpoint, scored_on
from ..models.trial_axis import Models
from ..config.run_kinds.encoder_pretraining import EncoderPretraining
from .task_base import TaskBase, same_arrays

EVAL_BATCHES = 4  # validation batches when run.eval_batches is 0


def encoder_objective():
    def objective(model, mb, key, totals):
        k_enc, k_sop = split_or_none(key, 2)
        out = model(mb["tokens"], mb["segments"], mb["mask"], key=k_enc)
        mlm = weighted_xent_sum(model.mlm_logits(out.h_BTD, mb["mlm_positions"]), mb["mlm_ids"],
                                mb["mlm_weights"]) / totals["predictions"]
        sop = jnp.sum(_xent(model.sop_logits(out.h_BTD, key=k_sop), mb["sop_labels"])) \
            / totals["rows"]
        return with_ponder(mlm + sop, {"mlm": mlm, "sop": sop}, out, mb["mask"],
                           model.ponder_weight, totals)

    return objective, batch_totals("predictions", "rows", "tokens")


def with_ponder(loss, parts: dict, out, mask_BT, weight, totals) -> tuple:
    """(loss + weight * ponder cost, the step's metrics): the ponder cost is the mean over rows
    of sum_t mask_t (N_t + R_t); the metrics add it and the mean iterations per real token."""
    real = mask_BT.astype(jnp.float32)
    ponder = jnp.sum(real * (out.N_BT + out.R_BT)) / totals["rows"]
    value = loss + weight * ponder
    return value, {"loss": value, **parts, "ponder": ponder,
                   "iterations": jnp.sum(real * out.N_BT) / totals["tokens"],
                   "tokens": jnp.sum(real)}


def mlm_config(cfg: Config) -> MLMConfig:
    d = cfg.data
    try:
        return MLMConfig(seq_len=d.seq_len, mask_rate=d.mask_rate,
                         max_predictions=d.max_predictions,
                         max_ngram=d.max_ngram)
    except ValueError as e:  # name the config field, not the internal dataclass
        raise ConfigError(f"data: {e}") from None


def _documents(cfg: Config) -> tuple[list[list[str]], list[list[str]]]:
    d = cfg.data
    if d.corpus == "grammar":
        docs = grammar_documents(d.grammar_docs, seed=d.grammar_seed)
    else:
        docs = text_documents([p.strip() for p in d.corpus.split(",") if p.strip()])
    if d.valid:
        return docs, text_documents([p.strip() for p in d.valid.split(",") if p.strip()])
    return split_documents(docs, d.valid_fraction, seed=d.valid_seed)


@dataclass(frozen=True)
class MLMPrepared:
    """What an MLM run reads before training: its tokenizer, the masking it trains with over
    a vocabulary of `vocab`, its training documents (tokenized only when training asks for
    them, not by eval.py) and fixed validation batches seeded apart from the training stream."""

    tokenizer: Any
    mlm: MLMConfig
    vocab: int
    train_docs: list[list[str]]
    valid: list[dict]


def read_mlm_corpus(cfg: Config, run_dir: Path, primary: bool, barrier, mlm: MLMConfig,
                    vocab: int, *, tokenizer=None,
                    copy_from: tuple[str, str] | None = None) -> MLMPrepared:
    """The MLM data of a run on data.corpus; its tokenizer kept, copied from `copy_from`, or
    trained on the training documents unless one is given."""
    train_docs, valid_docs = _documents(cfg)
    if not valid_docs:
        raise ConfigError("data.valid_fraction: no validation documents (set it > 0 or give "
                          "data.valid)")
    tokenizer = tokenizer or run_tokenizer(
        run_dir, vocab, primary, barrier, copy_from=copy_from,
        texts=lambda: [" ".join(doc) for doc in train_docs],
        required_chars=grammar.LF_SYMBOLS if cfg.data.corpus == "grammar" else "",
        source=corpus_name(cfg.data), vocab_field=cfg.vocab_field,
        model_type=cfg.data.tokenizer_type)
    valid = eval_mlm_batches(tokenize_mlm_documents(valid_docs, tokenizer), mlm, vocab,
                             n_batches=cfg.run.eval_batches or EVAL_BATCHES,
                             batch_size=cfg.data.batch_size, seed=cfg.run.seed + 1_000_003)
    return MLMPrepared(tokenizer, mlm, vocab, train_docs, valid)


class MLMCorpus(TaskBase):
    """Base of the encoder and MLM jobs: training on an MLM corpus (``read_mlm_corpus``)."""

    prepared: MLMPrepared

    def read_data(self, run_dir: Path, primary: bool, barrier) -> MLMPrepared:
        return read_mlm_corpus(self.cfg, run_dir, primary, barrier, mlm_config(self.cfg),
                               self.cfg.vocab_size,
                               copy_from=tokenizer_source("", self.cfg.data.tokenizer))

    def dataset(self) -> grain.MapDataset:
        p = self.prepared
        train = tokenize_mlm_documents(p.train_docs, p.tokenizer)
        return mlm_dataset(train, p.mlm, p.vocab, global_batch=self.cfg.data.batch_size,
                           seed=self.cfg.run.seed, process_index=jax.process_index(),
                           process_count=jax.process_count())


class EncoderTask(TaskBase):
    """What the encoder's tasks share: the ACT / ALBERT / BERT encoder (task_for says which)."""

    def __init__(self, cfg: Config, *, arch: str, untied: bool, adaptive: bool, halting: str):
        super().__init__(cfg)
        self.arch, self.untied, self.adaptive = arch, untied, adaptive
        self.encoder_cfg = dataclasses.replace(cfg.act, halting=halting)  # its arch's halting

    def build_encoder(self, *, key):
        return (UntiedEncoder if self.untied else ACTEncoder)(self.encoder_cfg, key=key)


class EncoderPretrainTask(EncoderTask, MLMCorpus):
    """MLM + SOP (+ ponder cost) pretraining; evaluation = Table 1 and Fig. 2 statistics."""
    RUNS = EncoderPretraining

    def build_model(self, *, key):
        k_enc, _ = jax.random.split(key)  # the second key was the head's, kept for old runs
        return self.build_encoder(key=k_enc)

    def objective(self):
        return encoder_objective()

    def evaluates_alike(self, tasks) -> bool:
        return all(same_arrays(t.prepared.valid, self.prepared.valid) for t in tasks)

    def evaluate(self, models: Models, tasks, step: int, sharding, final: bool) -> list:
        """Table 1 and Fig. 2 statistics of each trial (the forward vmapped over them)."""
        each = evaluate_act_each(models, self.prepared.valid, use_while=self.adaptive)
        return [t.finish_evaluation(res, step, final) for t, res in zip(tasks, each)]

    def finish_evaluation(self, res: dict, step: int, final: bool) -> tuple[dict, str]:
        t1 = res["table1"]
        scalars = {"mlm_accuracy": t1["mlm_accuracy"], "sop_accuracy": t1["sop_accuracy"],
                   "mean_iterations": t1["iterations"]["all"]}
        if final and self.primary:
            out = self.run_dir / "analysis"
            out.mkdir(parents=True, exist_ok=True)
            label = f"{self.arch} step {step}"
            write_table1(res, out / "table1.md", out / "table1.json", label=label)
            write_cosine_table(res["cosine"], out / "cosine.csv")
            plot_cosine(res["cosine"], out / "cosine.png",
                        title=f"{label}: consecutive-state cosine")
        msg = ", ".join(f"{k} {v:.4f}" for k, v in scalars.items() if v is not None)
        return {**scalars, "table1": t1, "cosine": _finite(res["cosine"]["overall"])}, msg

    def summary(self, model) -> dict:
        return {"arch": self.arch, "analysis": str(self.run_dir / "analysis")}

    EVAL_READS = frozenset({"step", "data", "batch", "out"})

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """Table 1 (MLM / SOP accuracy, mean iterations per token group) and Fig. 2 (cosine
        of consecutive iteration states) of the checkpoint, on the run's validation batches
        or on MLM batches built from --data files."""
        cfg, model, step, _, _ = load_checkpoint(run, request.step, request.batch)
        cfg = scored_on(cfg, request)
        reader = EncoderPretrainTask(cfg, arch=self.arch, untied=self.untied,
                                     adaptive=self.adaptive, halting=self.encoder_cfg.halting)
        valid = reader.read_data(run, primary=False, barrier=lambda: None).valid  # never writes
        res = evaluate_act(model, valid, use_while=self.adaptive)
        directory = Path(request.out) if request.out else run / "eval" / f"step{step}"
        out = {"run": str(run), "step": step,
               "data": request.data or "validation batches of the run",
               "table1": res["table1"]}
        label = f"{self.arch} step {step}"
        with writing_result(out, directory):  # computed first: printed even if not written
            directory.mkdir(parents=True, exist_ok=True)
            files = [write_table1(res, directory / "table1.md", directory / "table1.json",
                                  label=label),
                     write_cosine_table(res["cosine"], directory / "cosine.csv"),
                     plot_cosine(res["cosine"], directory / "cosine.png", title=label)]
        return {**out, "files": [str(f) for f in files]}


def _finite(xs) -> list:
    return [None if (x is None or (isinstance(x, float) and math.isnan(x))) else float(x)
            for x in xs]

