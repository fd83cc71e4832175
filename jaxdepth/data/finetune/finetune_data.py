"""Fine-tuning data: a task's splits, the tokenizer it shares with pretraining, prefix-LM features.

The tokenizer (`run_tokenizer`) is the run directory's (a resumed run), else copied from the
pretrained run (`task.init_from`) or `data.tokenizer`, else trained on the task's training text.
Pieces it does not know are counted in ``<run>/data/unk_report.json``, never silently dropped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...config import ConfigError, TaskConfig
from .grammar_tasks import make_task
from .prefix_lm_features import UnkReport, batch_features, count_unk, pack_features
from .seq2seq_readers import Example, load_task, split_validation
from ..corpus.prepare import run_tokenizer, tokenizer_source
from ..corpus.tokenizer import Tokenizer
from .. import shared_prep


@dataclass
class TaskData:
    tokenizer: Tokenizer
    train: dict[str, np.ndarray]  # prefix-LM features of the training split, [rows, seq_len]
    # (one example per row, or several with segment_ids when task.pack)
    dev: dict[str, np.ndarray]  # the same for the in-distribution dev split (loss)
    splits: dict[str, list[Example]]  # every split, by name
    eval_splits: tuple[str, ...]  # decoded and scored at each evaluation
    dev_split: str
    gen_splits: tuple[str, ...]  # pooled into the generalization accuracy
    unk: UnkReport


def task_splits(cfg: TaskConfig) -> tuple[dict[str, list[Example]], str, tuple[str, ...]]:
    """(splits by name, the in-distribution dev split, the generalization splits)."""
    if cfg.grammar:  # generated: a function of these four settings, shared by a run's trials
        key = shared_prep.digest("grammar task", cfg.name, cfg.n_train, cfg.n_eval, cfg.seed)
        splits = shared_prep.prepared(key, lambda: {
            s: tuple(e) for s, e in make_task(cfg.name, cfg.n_train, cfg.n_eval, cfg.seed).items()})
        return ({s: list(e) for s, e in splits.items()}, "dev", ("gen_lexical", "gen_structural"))
    if cfg.name == "geoquery":
        # No dev split is published: hold out a seeded share of train (docs/design.md §5).
        train, dev = split_validation(load_task("geoquery", cfg.dir, "train"),
                                      cfg.dev_fraction, cfg.seed)
        return {"train": train, "dev": dev, "test": load_task("geoquery", cfg.dir, "test")}, \
            "dev", ("test",)
    reader = "passivization" if cfg.name == "passivization" else cfg.name
    return ({s: load_task(reader, cfg.dir, s) for s in ("train", "dev", "test", "gen")},
            "dev", ("gen",))


def resolve_eval_splits(cfg: TaskConfig, splits: dict, dev: str,
                        gen: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(s.strip() for s in cfg.eval_splits.split(",") if s.strip()) or (dev, *gen)
    unknown = [s for s in names if s not in splits]
    if unknown:
        raise ConfigError(f"task.eval_splits: unknown split(s) {unknown} of task {cfg.name!r}; "
                          f"it has {sorted(splits)}")
    return names


def prepare_task_data(task: TaskConfig, tokenizer_path: str, vocab_size: int, seq_len: int,
                      run_dir: Path, is_primary: bool, barrier=lambda: None,
                      tokenizer_type: str = "unigram") -> TaskData:
    splits, dev, gen = task_splits(task)
    eval_splits = resolve_eval_splits(task, splits, dev, gen)
    tok = run_tokenizer(run_dir, vocab_size, is_primary, barrier,
                        copy_from=tokenizer_source(task.init_from, tokenizer_path),
                        texts=lambda: [t for e in splits["train"] for t in (e.source, e.target)],
                        source=f"the train split of task {task.name!r}",
                        model_type=tokenizer_type)
    # The features are a function of the tokenizer's bytes, the examples and these settings:
    # the trials of one run tokenize once.
    key = shared_prep.digest(
        "task features", tok.model_proto, seq_len, task.pack, task.truncate, task.seed, dev,
        eval_splits, *((s, *(f"{e.source}\t{e.target}" for e in splits[s]))
                       for s in ("train", dev, *eval_splits)))
    train, dev_features, unk = shared_prep.prepared(
        key, lambda: _features(task, splits, dev, eval_splits, tok, seq_len))
    if is_primary:
        (run_dir / "data" / "unk_report.json").write_text(json.dumps(unk_summary(unk), indent=2))
    return TaskData(tok, train, dev_features, splits, eval_splits, dev, gen, unk)


def _features(task: TaskConfig, splits: dict, dev: str, eval_splits: tuple[str, ...],
              tok, seq_len: int) -> tuple[dict, dict, UnkReport]:
    """(train features, dev features, the unknown-piece report)."""
    unk = count_unk([e for s in ("train", *eval_splits) for e in splits[s]], tok)
    keep = ("inputs", "targets", "weights")
    if task.pack:
        train = pack_features(splits["train"], tok, seq_len, task.seed, truncate=task.truncate)
    else:
        train = batch_features(splits["train"], tok, seq_len, truncate=task.truncate)
        train = {k: train[k] for k in keep}
    dev_features = batch_features(splits[dev], tok, seq_len, truncate=task.truncate)
    return train, {k: dev_features[k] for k in keep}, unk


def unk_summary(r: UnkReport) -> dict:
    return {"examples": r.n_examples, "examples_with_unk": r.examples_with_unk,
            "source_unk_tokens": r.source_unk_tokens, "target_unk_tokens": r.target_unk_tokens,
            "unknown_words": dict(r.unknown_words.most_common(20))}
