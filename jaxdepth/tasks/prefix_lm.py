"""Prefix-LM fine-tuning of the decoder on a seq2seq task (COGS, COGS-vf, GeoQuery,
passivization, the grammar's tasks; docs/design.md §2): the LM objective on the target only;
evaluation = in-distribution loss on dev and exact match of greedy decoding on the evaluation
splits, every point appended to evals.jsonl."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import grain
import jax
import numpy as np

from ..config import Config
from ..data.corpus.pipeline import ExampleBatchSource
from ..data.finetune.finetune_data import TaskData, prepare_task_data, unk_summary
from ..models.decoder import DecoderLM
from .eval_request import EvalRequest, load_checkpoint
from ..models.trial_axis import Models
from ..config.run_kinds.prefix_lm_finetuning import PrefixLMFinetuning
from .decoding import Geometry, evaluate_splits, summarize, write_predictions
from .lm import DecoderTask, mean_losses
from .task_base import same_arrays
from .registry import check_shape, load_init_from


def load_pretrained(cfg: Config, mesh) -> tuple[DecoderLM, int]:
    """The model of checkpoint task.init_step (0: latest) of run task.init_from, placed like
    the fine-tuning model, and its step."""
    model, pre, step = load_init_from(cfg, mesh)
    # The other fields (dropout, dtype, remat...) are run-time options.
    check_shape("model", cfg.model.shape(), pre.model.shape(), cfg.task.init_from, step)
    return model, step


@dataclass(frozen=True)
class PrefixLMPrepared:
    """What a fine-tuning run reads before training: the task's tokenized splits, the dev
    batches of its loss, the examples exact match scores at every evaluation point and the
    decoding's shapes for them."""

    data: TaskData
    dev: list[dict]
    scored: dict[str, list]
    geometry: Geometry


class PrefixLMTask(DecoderTask):
    """Prefix-LM fine-tuning on a seq2seq task; evaluation = in-distribution loss on dev and
    exact match on the evaluation splits. Every evaluation point is appended to evals.jsonl."""
    RUNS = PrefixLMFinetuning

    prepared: PrefixLMPrepared

    def read_data(self, run_dir: Path, primary: bool, barrier) -> PrefixLMPrepared:
        cfg = self.cfg
        d = prepare_task_data(cfg.task, cfg.data.tokenizer, cfg.vocab_size, cfg.data.seq_len,
                              run_dir, primary, barrier, cfg.data.tokenizer_type)
        b = cfg.data.batch_size
        dev = _pad_rows(d.dev, b)
        # The same seeded subset at every evaluation point, the last one included; eval.py
        # scores whole splits.
        scored = {s: fixed_subset(d.splits[s], cfg.task.eval_max, cfg.task.seed)
                  for s in d.eval_splits}
        batch = cfg.task.eval_batch or cfg.data.batch_size
        return PrefixLMPrepared(
            data=d, dev=[{k: v[i:i + b] for k, v in dev.items()}
                         for i in range(0, len(dev["inputs"]), b)],
            scored=scored,
            geometry=Geometry.fit([e for ex in scored.values() for e in ex], d.tokenizer, batch))

    def dataset(self) -> grain.MapDataset:
        return grain.MapDataset.source(ExampleBatchSource(
            self.prepared.data.train, global_batch=self.cfg.data.batch_size,
            seed=self.cfg.run.seed,
            process_index=jax.process_index(), process_count=jax.process_count()))

    def initial_model(self, mesh, fresh):
        """The pretrained decoder (task.init_from), with this run's run-time options."""
        if not self.cfg.task.init_from:
            return None
        model, step = load_pretrained(self.cfg, mesh)
        self.started_from(step)
        return model.with_options(**dataclasses.asdict(self.cfg.model))

    def evaluates_alike(self, tasks) -> bool:
        # the prompts are encoded, and every trial's output decoded, with this tokenizer
        p = self.prepared
        proto = p.data.tokenizer.model_proto
        return all(same_arrays(t.prepared.dev, p.dev) and t.prepared.scored == p.scored
                   and t.prepared.geometry == p.geometry
                   and t.prepared.data.tokenizer.model_proto == proto for t in tasks)

    def evaluate(self, models: Models, tasks, step: int, sharding, final: bool) -> list:
        """Dev loss and exact match of each trial (decoded side by side, vmapped); each
        trial's task appends to its own evals.jsonl and writes its own predictions."""
        p = self.prepared
        losses = mean_losses(models, p.dev, sharding)
        records = evaluate_splits(models, p.data.tokenizer, p.scored, p.geometry)
        return [t.finish_evaluation(loss, rec, step, final)
                for t, (loss, _), rec in zip(tasks, losses, records)]

    def finish_evaluation(self, loss: float, records: dict, step: int,
                          final: bool) -> tuple[dict, str]:
        d = self.prepared.data
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
        d = self.prepared.data
        return {"task": self.cfg.task.name, "init_from": self.cfg.task.init_from,
                "init_step": self.init_step, "unk": unk_summary(d.unk),
                "train_examples": len(d.splits["train"]), "train_rows": len(d.train["inputs"]),
                "train_fill": float(np.mean(d.train["targets"] != 0))}

    EVAL_READS = frozenset({"step", "batch", "out", "splits", "task_dir", "max_examples"})

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """Exact match of the checkpoint on whole splits; writes predictions + summary."""
        from ..data.finetune.finetune_data import resolve_eval_splits, task_splits

        cfg, model, step, tok, _ = load_checkpoint(run, request.step, request.batch)
        task = dataclasses.replace(cfg.task, dir=request.task_dir or cfg.task.dir,
                                   eval_splits=request.splits, eval_max=request.max_examples)
        all_splits, dev, gen = task_splits(task)
        names = resolve_eval_splits(task, all_splits, dev, gen)
        chosen = {s: fixed_subset(all_splits[s], request.max_examples, task.seed) for s in names}
        geo = Geometry.fit([e for ex in chosen.values() for e in ex], tok,
                           request.batch or cfg.task.eval_batch or cfg.data.batch_size)
        records = evaluate_splits(Models(model), tok, chosen, geo)[0]
        summary = {"run": str(run), "step": step, "task": task.name, "task_dir": task.dir,
                   **summarize(records, dev, gen)}
        directory = Path(request.out) if request.out else run / "eval" / f"step{step}"
        from ..errors import writing_result

        with writing_result(summary, directory):  # eval.py prints it if it cannot be written
            summary["files"] = write_predictions(directory, records, summary)
        return {k: summary[k] for k in ("step", "task", "id_accuracy", "gen_accuracy",
                                        "lexical", "structural", "files") if k in summary}


def _pad_rows(features: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Zero rows (weight 0) appended so the row count divides `multiple`."""
    pad = -len(features["inputs"]) % multiple
    return {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)])
            for k, v in features.items()}


def fixed_subset(examples: list, n: int, seed: int) -> list:
    """A fixed seeded sample of n examples (in file order) -- the same at every evaluation."""
    if not n or n >= len(examples):
        return examples
    keep = np.sort(np.random.default_rng(seed).permutation(len(examples))[:n])
    return [examples[i] for i in keep]
