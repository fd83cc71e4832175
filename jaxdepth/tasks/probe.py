"""Fine-tuning an encoder (ACT, ALBERT, BERT) on the embedded grammar's classification and
probing tasks: main-verb tense, subject number, object number (sentence level, from [CLS]) and
the grammatical role of every token (token level). The ponder cost stays in the loss.

Evaluation reports accuracy and mean iterations on dev (and test at the end); for the roles
task also the mean iterations per role (the paper's Table 3), written to
``<run>/analysis/probe.{json,md}``. Running the same command on an `albert` or `bert` run
gives the fixed-depth baseline to compare against.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import numpy as np

from ..config import Config, ConfigError
from ..data.embedded import grammar
from ..data.corpus.pipeline import ExampleBatchSource
from ..data.finetune.probing import ROLE_NAMES, label_names, make_probe_data
from ..data.corpus.prepare import run_tokenizer, tokenizer_source
from ..models.act import EncoderClassifier
from .losses import batch_totals, labelled_xent_sum, softmax_xent as _xent
from .eval_request import EvalRequest
from ..config.run_kinds.probe_finetuning import ProbeFinetuning
from .encoder_pretrain import EncoderTask, with_ponder
from .registry import check_shape, load_init_from, task_for


def probe_objective():
    def objective(model, mb, key, totals):
        logits, out = model(mb["tokens"], mb["segments"], mb["mask"], key=key)
        if model.token_level:
            ce = labelled_xent_sum(logits, mb["labels"]) / totals["labels"]
        else:
            ce = jnp.sum(_xent(logits, mb["labels"])) / totals["rows"]
        return with_ponder(ce, {"ce": ce}, out, mb["mask"], model.encoder.ponder_weight, totals)

    return objective, batch_totals("rows", "labels", "tokens")


@eqx.filter_jit
def _predict(model, tokens, segments, mask, inference: bool):
    logits, out = model(tokens, segments, mask, inference=inference)
    return jnp.argmax(logits, -1), out.N_BT


@dataclass(frozen=True)
class ProbePrepared:
    """What a probing run reads: the probing task's train/dev/test arrays (tokenized with the
    run's tokenizer, which the run directory keeps)."""

    splits: dict[str, dict[str, np.ndarray]]


class ProbeTask(EncoderTask):
    """An encoder under a classification head, fine-tuned on a grammar probing task."""
    RUNS = ProbeFinetuning

    prepared: ProbePrepared

    def __init__(self, cfg: Config, *, token_level: bool, **encoder):
        super().__init__(cfg, **encoder)
        self.token_level = token_level

    def build_model(self, *, key):
        k_enc, k_head = jax.random.split(key)
        return EncoderClassifier(self.build_encoder(key=k_enc),
                                 len(label_names(self.cfg.task.name)),
                                 self.token_level, key=k_head)

    def read_data(self, run_dir: Path, primary: bool, barrier) -> ProbePrepared:
        cfg, t = self.cfg, self.cfg.task
        tokenizer = run_tokenizer(
            run_dir, cfg.vocab_size, primary, barrier,
            copy_from=tokenizer_source(t.init_from, cfg.data.tokenizer),
            texts=lambda: grammar.corpus_texts(cfg.data.grammar_docs, seed=cfg.data.grammar_seed),
            vocab_field=cfg.vocab_field, model_type=cfg.data.tokenizer_type)
        return ProbePrepared(make_probe_data(
            t.name, tokenizer, n_train=t.n_train, n_eval=t.n_eval, seed=t.seed,
            seq_len=cfg.data.seq_len))

    def dataset(self) -> grain.MapDataset:
        keep = ("tokens", "segments", "mask", "labels")
        return grain.MapDataset.source(ExampleBatchSource(
            {k: self.prepared.splits["train"][k] for k in keep},
            global_batch=self.cfg.data.batch_size,
            seed=self.cfg.run.seed, process_index=jax.process_index(),
            process_count=jax.process_count()))

    def objective(self):
        return probe_objective()

    def initial_model(self, mesh, fresh):
        """The pretrained encoder (task.init_from) under a fresh head, with this run's options."""
        if not self.cfg.task.init_from:
            return None
        src = self.cfg.task.init_from
        encoder, pre, step = load_init_from(self.cfg, mesh)
        source = task_for(pre)
        if not isinstance(source, EncoderTask):
            raise ConfigError(f"task.init_from: {src} is not an encoder run (act, albert or bert)")
        mine = self.encoder_cfg
        check_shape("act", mine.shape(), source.encoder_cfg.shape(), src, step)
        if source.untied != self.untied:
            raise ConfigError(f"model.arch: {self.arch!r} cannot start from the "
                              f"{source.arch!r} checkpoint {src}")
        names = (("dropout", "remat") if self.untied
                 else ("dropout", "tau", "eps", "halting", "remat"))
        encoder = encoder.with_options(**{f: getattr(mine, f) for f in names})
        self.started_from(step)
        return eqx.tree_at(lambda m: m.encoder, fresh, encoder)

    def _score(self, model, split: str) -> dict:
        d = self.prepared.splits[split]
        b = self.cfg.task.eval_batch or self.cfg.data.batch_size
        inference = self.adaptive
        outs = [_predict(model, d["tokens"][i:i + b], d["segments"][i:i + b], d["mask"][i:i + b],
                         inference) for i in range(0, len(d["tokens"]), b)]
        pred = np.concatenate([np.asarray(p) for p, _ in outs])
        N = np.concatenate([np.asarray(n) for _, n in outs])
        real = d["mask"] > 0
        labels = d["labels"]
        if labels.ndim == 2:
            valid = labels >= 0
            acc = float((pred == labels)[valid].mean())
        else:
            acc = float((pred == labels).mean())
        res = {"accuracy": acc, "mean_iterations": float(N[real].mean()), "n": int(len(labels))}
        if "roles" in d:
            roles = d["roles"]
            res["iterations_by_role"] = {
                name: {"iterations": float(N[roles == i].mean()), "count": int((roles == i).sum())}
                for i, name in enumerate(ROLE_NAMES) if (roles == i).any()}
        return res

    def evaluate(self, models, tasks, step: int, sharding, final: bool) -> list:
        return [t._evaluate(models.one(k), step, final) for k, t in enumerate(tasks)]

    def _evaluate(self, model, step: int, final: bool) -> tuple[dict, str]:
        model = eqx.tree_at(lambda m: m.encoder, model, model.encoder.with_options(dropout=0.0))
        dev = self._score(model, "dev")
        res = {"dev_accuracy": dev["accuracy"], "dev_iterations": dev["mean_iterations"]}
        if final:
            test = self._score(model, "test")
            res.update(test_accuracy=test["accuracy"], test_iterations=test["mean_iterations"])
            detail = {"task": self.cfg.task.name, "arch": self.arch, "step": step,
                      "labels": list(label_names(self.cfg.task.name)), "dev": dev, "test": test}
            res["probe"] = detail
            if self.primary:
                out = self.run_dir / "analysis"
                out.mkdir(parents=True, exist_ok=True)
                (out / "probe.json").write_text(json.dumps(detail, indent=2))
                (out / "probe.md").write_text(probe_markdown(detail))
        msg = ", ".join(f"{k} {v:.4f}" for k, v in res.items() if isinstance(v, float))
        return res, msg

    def summary(self, model) -> dict:
        return {"task": self.cfg.task.name, "arch": self.arch,
                "init_from": self.cfg.task.init_from, "init_step": self.init_step,
                "analysis": str(self.run_dir / "analysis")}

    EVAL_READS = frozenset()  # its results are written while it trains

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        raise ConfigError(f"--run: {run} fine-tunes an encoder on a probing task: its dev/test "
                          f"results are in {run / 'analysis' / 'probe.json'}", field="run")


def probe_markdown(detail: dict) -> str:
    lines = [f"{detail['arch']} fine-tuned on {detail['task']} (step {detail['step']})", "",
             "| split | accuracy (%) | mean iterations |", "|---|---:|---:|"]
    for split in ("dev", "test"):
        r = detail[split]
        lines.append(f"| {split} | {100 * r['accuracy']:.1f} | {r['mean_iterations']:.2f} |")
    roles = detail["test"].get("iterations_by_role")
    if roles:
        lines += ["", "Mean iterations per role (test):", "", "| role | tokens | iterations |",
                  "|---|---:|---:|"]
        for name, r in sorted(roles.items(), key=lambda kv: -kv[1]["iterations"]):
            lines.append(f"| {name} | {r['count']} | {r['iterations']:.2f} |")
    return "\n".join(lines) + "\n"
