"""Causal LM pretraining of the decoder (Petty et al.'s pretraining; docs/design.md §2):
next-token cross-entropy (+ optional z-loss) on a corpus; evaluation = validation perplexity;
at the end, greedy samples. Also the LM objective the prefix-LM task fine-tunes with."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import numpy as np

from ..config import Config, ConfigError
from ..data.corpus.pipeline import eval_batches, lm_dataset, window_batches
from ..data.corpus.prepare import (LMData, StreamData, corpus_name, prepare_lm_data,
                                   prepare_streaming)
from ..data.corpus.tokenizer import EOS_ID
from ..data.corpus.streaming import streaming_dataset
from ..models.decoder import DecoderLM, generate
from .losses import fused_lm_head_loss, lm_loss_sums
from ..trainer.sharding import local_rows, to_global
from .eval_request import EvalRequest, load_checkpoint
from ..models.trial_axis import Models
from ..config.run_kinds.lm_pretraining import LMPretraining
from .task_base import TaskBase, same_arrays


def lm_objective(cfg: Config):
    """Causal / prefix LM: sums of weighted NLL (+ z-loss) per micro-batch; the step divides
    the summed gradient once by the batch's total weight ("divisor")."""
    z_loss = cfg.model.z_loss

    def objective(model, mb, key, totals):
        if not cfg.model.xent_chunk:
            logits = model(mb["inputs"], key=key, segment_ids_BT=mb.get("segment_ids"))
            obj, nll, n = lm_loss_sums(logits, mb["targets"], mb["weights"], z_loss)
            return obj, {"loss": nll, "tokens": n}
        x_BTD, _ = model.hidden(mb["inputs"], key=key, segment_ids_BT=mb.get("segment_ids"))
        head = model.lm_head.astype(model.compute_dtype)
        obj, nll = fused_lm_head_loss(x_BTD.reshape(-1, x_BTD.shape[-1]), head,
                                      mb["targets"].reshape(-1), mb["weights"].reshape(-1),
                                      z_loss, cfg.model.xent_chunk)
        return obj, {"loss": nll, "tokens": jnp.sum(mb["weights"])}

    return objective, lambda batch: {"divisor": jnp.sum(batch["weights"])}


@eqx.filter_jit
def eval_step(model: DecoderLM, batch):
    """Sums of NLL and weights over one (possibly padded) batch; no dropout."""
    logits = model(batch["inputs"], segment_ids_BT=batch.get("segment_ids"))
    _, nll, n = lm_loss_sums(logits, batch["targets"], batch["weights"])
    return nll, n


def mean_losses(models: Models, batches: list[dict], sharding) -> list[tuple[float, float]]:
    """Per trial (one for a solo run): (mean weighted NLL, total weight) over batches; one
    host sync after all are dispatched."""
    sums = jax.device_get([models(eval_step, to_global(local_rows(b), sharding))
                           for b in batches])  # [batch][trial] -> (nll, weight)
    out = []
    for k in range(len(models)):
        nll, n = sum(float(b[k][0]) for b in sums), sum(float(b[k][1]) for b in sums)
        out.append((nll / max(n, 1.0), n))
    return out


def valid_metrics(loss: float, n: float) -> dict:
    return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 80.0)), "valid_tokens": n}


class DecoderTask(TaskBase):
    """What the decoder's tasks share: the model and its objective."""

    reports_perplexity = True

    def build_model(self, *, key):
        return DecoderLM(self.cfg.model, key=key)

    def objective(self):
        return lm_objective(self.cfg)


@dataclass(frozen=True)
class LMPrepared:
    """What an LM run reads before training: its corpus (tokenized, or the stream's files) and
    the validation batches every evaluation point scores."""

    corpus: LMData | StreamData
    valid: list[dict]


class LMTask(DecoderTask):
    """Causal LM pretraining on a corpus; evaluation = validation perplexity."""
    RUNS = LMPretraining

    prepared: LMPrepared

    def read_data(self, run_dir: Path, primary: bool, barrier) -> LMPrepared:
        cfg = self.cfg
        if cfg.data.streaming:
            corpus = prepare_streaming(cfg.data, cfg.vocab_size, run_dir, primary, barrier,
                                       max_valid_batches=cfg.run.eval_batches)
            return LMPrepared(corpus, corpus.valid)
        corpus = prepare_lm_data(cfg.data, cfg.vocab_size, run_dir, primary, barrier=barrier)
        check_token_counts(cfg, len(corpus.train), len(corpus.valid))
        valid = eval_batches(corpus.valid, seq_len=cfg.data.seq_len,
                             batch_size=cfg.data.batch_size)
        return LMPrepared(corpus, valid[:cfg.run.eval_batches] if cfg.run.eval_batches else valid)

    def dataset(self) -> grain.MapDataset | grain.IterDataset:
        cfg = self.cfg
        where = dict(process_index=jax.process_index(), process_count=jax.process_count())
        corpus = self.prepared.corpus
        if cfg.data.streaming:
            return streaming_dataset(corpus.files, seq_len=cfg.data.seq_len,
                                     global_batch=cfg.data.batch_size, n_streams=cfg.data.streams,
                                     seed=cfg.run.seed, tokenizer=str(corpus.tokenizer_path),
                                     workers=cfg.data.workers,
                                     restart=cfg.data.restart_stream, **where)
        return lm_dataset(corpus.train, seq_len=cfg.data.seq_len,
                          global_batch=cfg.data.batch_size, seed=cfg.run.seed, **where)

    def evaluates_alike(self, tasks) -> bool:
        return all(same_arrays(t.prepared.valid, self.prepared.valid) for t in tasks)

    def evaluate(self, models: Models, tasks, step: int, sharding, final: bool) -> list:
        """Validation perplexity of each trial, in one vmapped pass over the batches; the
        share of grammatical samples (data.corpus grammar), trial by trial."""
        out = []
        for k, (loss, n) in enumerate(mean_losses(models, self.prepared.valid, sharding)):
            ev = valid_metrics(loss, n)
            message = f"valid loss {ev['valid_loss']:.4f}, perplexity {ev['valid_ppl']:.3f}"
            t, samples = tasks[k], self.cfg.run.grammar_samples
            if t.cfg.data.corpus == "grammar" and samples:
                corpus = t.prepared.corpus
                ev["grammatical"] = grammatical_share(models.one(k), corpus.tokenizer,
                                                      corpus.valid_docs[:samples],
                                                      t.cfg.run.sample_tokens)
                message += f", grammatical {ev['grammatical']:.0%}"
            out.append((ev, message))
        return out

    def summary(self, model: DecoderLM) -> dict:
        corpus, run = self.prepared.corpus, self.cfg.run
        return {"samples": sampled_continuations(model, corpus.tokenizer, corpus.valid_docs,
                                                 run.samples, run.sample_tokens, seed=run.seed),
                # how many continuations a "grammatical" share is of (not a number to average
                # over trials, hence nested)
                "grammar_check": {"continuations": min(run.grammar_samples,
                                                       len(corpus.valid_docs))}}

    EVAL_READS = frozenset({"step", "data", "batch", "out"})

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """Perplexity of the checkpoint on the run's validation set or on --data files."""
        from ..data.corpus.packing import document_ids, iter_windows
        from ..data.corpus.pipeline import load_tokens, tokenize_documents
        from ..data.corpus.prepare import valid_documents
        from ..data.corpus.readers import read_corpus, resolve_paths
        from ..trainer.sharding import batch_sharding

        cfg, model, step, tok, mesh = load_checkpoint(run, request.step, request.batch)
        batch = request.batch or cfg.data.batch_size
        source = "validation set of the run"
        if cfg.data.streaming:  # documents packed and kept apart, as the run trained
            if request.data:
                source = resolve_paths(request.data, "--data")
                docs = (document_ids(tok.encode(d)) for d in valid_documents(source))
                batches = window_batches(iter_windows(docs, cfg.data.seq_len), batch)
            else:
                batches = prepare_streaming(cfg.data, cfg.vocab_size, run, is_primary=False,
                                            batch_size=batch).valid
        else:
            if request.data:
                source = resolve_paths(request.data, "--data")
                tokens = tokenize_documents(read_corpus(source), tok)
            else:
                tokens = load_tokens(run / "data" / "valid.npy")
            batches = eval_batches(tokens, seq_len=cfg.data.seq_len, batch_size=batch)
        result = valid_metrics(*mean_losses(Models(model), batches, batch_sharding(mesh))[0])
        out = {"run": str(run), "step": step, "data": source, "seq_len": cfg.data.seq_len,
               "tokens": result["valid_tokens"], "loss": result["valid_loss"],
               "perplexity": result["valid_ppl"]}
        write_json(Path(request.out or run / f"eval_step{step}.json"), out)
        return out


def check_token_counts(cfg: Config, n_train: int, n_valid: int) -> None:
    """ConfigError, naming the field and the numbers, unless the training tokens make a
    batch of windows (data.batch_size windows of data.seq_len + 1 tokens) and the
    validation tokens at least one prediction."""
    d = cfg.data
    source = corpus_name(d)
    windows = max(n_train - 1, 0) // d.seq_len
    if windows == 0:
        raise ConfigError(f"data.seq_len: {d.seq_len} is longer than the training text: "
                          f"{source} makes {n_train} training tokens, and a window takes "
                          f"data.seq_len + 1; lower --data.seq_len", field="data.seq_len")
    if windows < d.batch_size:
        raise ConfigError(f"data.batch_size: {d.batch_size} windows per batch are more than the "
                          f"{windows} windows of data.seq_len={d.seq_len} that {source} makes "
                          f"({n_train} training tokens); lower --data.batch_size (or "
                          f"--data.seq_len)", field="data.batch_size")
    if n_valid < 2:
        if d.valid.strip():
            raise ConfigError(f"data.valid: {d.valid} holds {n_valid} tokens; validation needs "
                              f"at least 2", field="data.valid")
        raise ConfigError(f"data.valid_fraction: {d.valid_fraction} holds out no validation "
                          f"document of {source}; give --data.valid files or a larger "
                          f"--data.valid_fraction", field="data.valid_fraction")


def write_json(path: Path, obj: dict) -> None:
    """ResultNotWritten (which carries obj, for eval.py to print) if path cannot be written."""
    from ..errors import writing_result

    with writing_result(obj, path):
        path.write_text(json.dumps(obj, indent=2) + "\n")


def _continue(model: DecoderLM, tokenizer, docs: list[str], max_new: int, key
              ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, continuation ids sampled with `key`, up to and with its EOS) for each
    document: the prompt is the first half of its first 12 tokens."""
    prompts = [tokenizer.encode(d)[:12] for d in docs if d.strip()]
    prompts = [p[: max(1, len(p) // 2)] for p in prompts]
    if not prompts:
        return []
    arr = np.zeros((len(prompts), max(len(p) for p in prompts)), np.int32)
    for i, p in enumerate(prompts):
        arr[i, :len(p)] = p
    out = np.asarray(generate(model, jnp.asarray(arr),
                              jnp.asarray([len(p) for p in prompts], jnp.int32), max_new, key=key))
    conts = [o[:o.index(EOS_ID) + 1] if EOS_ID in o else o for o in out.tolist()]
    return list(zip(prompts, conts))


def sampled_continuations(model: DecoderLM, tokenizer, valid_docs: list[str], n: int,
                          max_new: int, seed: int = 0) -> list[dict]:
    """Continue the first half (at most 12 tokens) of the first n validation documents with
    tokens sampled from the model (temperature 1, key `seed`: the same run prints the same
    samples). Sampled rather than greedy: an argmax chain shows a model's most likely loop,
    not what it has learned to write."""
    if n == 0:
        return []
    return [{"prompt": tokenizer.decode(p), "continuation": tokenizer.decode(c)}
            for p, c in _continue(model, tokenizer, valid_docs[:n], max_new,
                                  key=jax.random.key(seed))]


def grammatical_share(model: DecoderLM, tokenizer, docs: list[str], max_new: int,
                      seed: int = 0) -> float:
    """Share of continuations of `docs`' prompts, sampled from the model (temperature 1, a
    fixed key: the same draws at every evaluation), that, read with their prompt, are
    sentences of the embedded grammar (data/embedded/recognizer.py). Sampled, not greedy: the
    question is whether the model's distribution has learned the rules, and an argmax
    chain can repeat one safe clause forever. A continuation that ended with EOS must end a
    sentence; one cut by `max_new` may end inside one that can be completed."""
    from ..data.embedded.recognizer import is_grammatical
    pairs = _continue(model, tokenizer, docs, max_new, key=jax.random.key(seed))
    ok = [is_grammatical(tokenizer.decode(p + c), prefix=not (c and c[-1] == EOS_ID))
          for p, c in pairs]
    return float(np.mean(ok)) if ok else 0.0
