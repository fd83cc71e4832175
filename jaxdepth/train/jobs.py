"""What the training loop trains on and how it evaluates: LM pretraining or prefix-LM
fine-tuning. The loop (loop.py) is the same for both; a job supplies the data, the optional
pretrained weights, the evaluation at each evaluation point and the final summary.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np

from ..config import Config, ConfigError
from ..data.pipeline import ExampleBatchSource, eval_batches, lm_dataset
from ..data.prepare import LMData, prepare_lm_data
from ..data.task_data import TaskData, prepare_task_data, unk_summary
from ..models.decoder import DecoderLM, greedy_generate
from . import checkpoint as ckpt
from .state import eval_step
from .task_eval import Geometry, evaluate_splits, summarize, write_predictions


def to_global(batch: dict, sharding) -> dict:
    """Process-local rows -> global arrays sharded over the data axis."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}


def local_rows(batch: dict) -> dict:
    p, n = jax.process_index(), jax.process_count()
    rows = next(iter(batch.values())).shape[0] // n
    return {k: v[p * rows:(p + 1) * rows] for k, v in batch.items()}


def mean_loss(model: DecoderLM, batches: list[dict], sharding) -> tuple[float, float]:
    """(mean weighted NLL, total weight) over batches; one host sync after all are dispatched."""
    sums = jax.device_get([eval_step(model, to_global(local_rows(b), sharding)) for b in batches])
    nll, n = sum(float(s) for s, _ in sums), sum(float(c) for _, c in sums)
    return nll / max(n, 1.0), n


def evaluate(model: DecoderLM, batches: list[dict], sharding) -> dict:
    loss, n = mean_loss(model, batches, sharding)
    return {"valid_loss": loss, "valid_ppl": math.exp(min(loss, 80.0)), "valid_tokens": n}


class LMJob:
    """Causal LM pretraining on a corpus; evaluation = validation perplexity."""

    def __init__(self, cfg: Config, run_dir: Path, primary: bool, barrier):
        self.cfg = cfg
        self.data: LMData = prepare_lm_data(cfg.data, cfg.model.vocab_size, run_dir, primary,
                                            barrier=barrier)
        valid = eval_batches(self.data.valid, seq_len=cfg.data.seq_len,
                             batch_size=cfg.data.batch_size)
        self.valid = valid[:cfg.run.eval_batches] if cfg.run.eval_batches else valid

    def dataset(self) -> grain.MapDataset:
        return lm_dataset(self.data.train, seq_len=self.cfg.data.seq_len,
                          global_batch=self.cfg.data.batch_size, seed=self.cfg.run.seed,
                          process_index=jax.process_index(), process_count=jax.process_count())

    def initial_model(self, mesh, fresh):
        return None

    def objective(self):
        return None  # the LM objective of train/state.py

    def evaluate(self, model: DecoderLM, step: int, sharding, final: bool) -> tuple[dict, str]:
        ev = evaluate(model, self.valid, sharding)
        return ev, f"valid loss {ev['valid_loss']:.4f}, perplexity {ev['valid_ppl']:.3f}"

    def summary(self, model: DecoderLM) -> dict:
        return {"samples": greedy_samples(model, self.data, self.cfg.run.samples,
                                          self.cfg.run.sample_tokens)}


def greedy_samples(model: DecoderLM, data: LMData, n: int, max_new: int) -> list[dict]:
    """Continue the first half (at most 12 tokens) of the first n validation documents."""
    if n == 0:
        return []
    prompts = [data.tokenizer.encode(d)[:12] for d in data.valid_docs[:n] if d.strip()]
    prompts = [p[: max(1, len(p) // 2)] for p in prompts]
    width = max(len(p) for p in prompts)
    arr = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        arr[i, :len(p)] = p
    out = np.asarray(greedy_generate(model, jnp.asarray(arr),
                                     jnp.asarray([len(p) for p in prompts], jnp.int32), max_new))
    return [{"prompt": data.tokenizer.decode(p), "continuation": data.tokenizer.decode(o.tolist())}
            for p, o in zip(prompts, out)]


# Model fields that must agree between a pretrained checkpoint and the model fine-tuned from
# it (the others -- dropout, dtype, remat, scan layout -- are run-time options).
SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "d_ff", "n_heads", "rel_buckets",
                "rel_max_distance")


def load_pretrained(cfg: Config, mesh) -> tuple[DecoderLM, int]:
    """The model of checkpoint task.init_step (0: latest) of run task.init_from, placed like
    the fine-tuning model, and its step."""
    src = Path(cfg.task.init_from)
    try:
        model, pre, step = ckpt.load_model(src, cfg.task.init_step or None, mesh, cfg.mesh,
                                           label="task.init_step")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"task.init_from: {e}") from None
    for f in SHAPE_FIELDS:
        mine, theirs = getattr(cfg.model, f), getattr(pre.model, f)
        if mine != theirs:
            raise ConfigError(
                f"model.{f}: {mine} here but {theirs} in the pretrained checkpoint {src} "
                f"(step {step}); start from its config: --config {src / 'config.json'}")
    return model, step


class TaskJob:
    """Prefix-LM fine-tuning on a seq2seq task; evaluation = in-distribution loss on dev and
    exact match on the evaluation splits. Every evaluation point is appended to evals.jsonl."""

    def __init__(self, cfg: Config, run_dir: Path, primary: bool, barrier):
        self.cfg, self.run_dir, self.primary = cfg, run_dir, primary
        self.data: TaskData = prepare_task_data(cfg.task, cfg.data.tokenizer, cfg.model.vocab_size,
                                                cfg.data.seq_len, run_dir, primary, barrier)
        d = self.data
        b = cfg.data.batch_size
        dev = _pad_rows(d.dev, b)
        self.dev = [{k: v[i:i + b] for k, v in dev.items()} for i in range(0, len(dev["inputs"]), b)]
        # The same seeded subset at every evaluation point, the last one included; eval.py
        # scores whole splits.
        self.scored = {s: fixed_subset(d.splits[s], cfg.task.eval_max, cfg.task.seed)
                       for s in d.eval_splits}
        batch = cfg.task.eval_batch or cfg.data.batch_size
        self.geometry = Geometry.fit([e for ex in self.scored.values() for e in ex],
                                     d.tokenizer, batch)
        self.init_step = None

    def dataset(self) -> grain.MapDataset:
        return grain.MapDataset.source(ExampleBatchSource(
            self.data.train, global_batch=self.cfg.data.batch_size, seed=self.cfg.run.seed,
            process_index=jax.process_index(), process_count=jax.process_count()))

    def initial_model(self, mesh, fresh):
        """The pretrained decoder (task.init_from), with this run's run-time options."""
        if not self.cfg.task.init_from:
            return None
        model, self.init_step = load_pretrained(self.cfg, mesh)
        return model.with_options(**dataclasses.asdict(self.cfg.model))

    def objective(self):
        return None  # the LM objective, with the prefix-LM weights of the features

    def evaluate(self, model: DecoderLM, step: int, sharding, final: bool) -> tuple[dict, str]:
        loss, _ = mean_loss(model, self.dev, sharding)
        d = self.data
        records = evaluate_splits(model, d.tokenizer, self.scored, self.geometry)
        res = {"dev_loss": loss, **summarize(records, d.dev_split, d.gen_splits)}
        if self.primary:
            with open(self.run_dir / "evals.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "final": final, **res}) + "\n")
            if final:
                res["predictions"] = write_predictions(self.run_dir / "predictions", records,
                                                       {"step": step, **res})
        msg = ", ".join(f"{k} {res[k]:.4f}" for k in ("dev_loss", "id_accuracy", "gen_accuracy",
                                                       "lexical", "structural")
                        if res.get(k) is not None)
        return res, msg

    def summary(self, model: DecoderLM) -> dict:
        return {"task": self.cfg.task.name, "init_from": self.cfg.task.init_from,
                "init_step": self.init_step, "unk": unk_summary(self.data.unk),
                "train_examples": len(self.data.train["inputs"])}


def _pad_rows(features: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Zero rows (weight 0) appended so the row count divides `multiple`."""
    pad = -len(features["inputs"]) % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in features.items()}


def fixed_subset(examples: list, n: int, seed: int) -> list:
    """A fixed seeded sample of n examples (in file order) -- the same at every evaluation."""
    if not n or n >= len(examples):
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(len(examples))[:n])
    return [examples[i] for i in keep]


def make_job(cfg: Config, run_dir: Path, primary: bool, barrier):
    if cfg.task.name == "ner":
        from .ner_job import NERJob
        return NERJob(cfg, run_dir, primary, barrier)
    if cfg.task.name == "mlm" or cfg.model.arch == "encoder":
        from .mlm_job import MLMJob
        return MLMJob(cfg, run_dir, primary, barrier)
    if cfg.model.arch != "decoder":
        if cfg.task.name:
            from .probe_job import ProbeJob
            return ProbeJob(cfg, run_dir, primary, barrier)
        from .encoder_job import EncoderJob
        return EncoderJob(cfg, run_dir, primary, barrier)
    return (TaskJob if cfg.task.name else LMJob)(cfg, run_dir, primary, barrier)
