"""Exact-match evaluation of a prefix LM: batched greedy decoding with the KV cache, scoring,
per-type accuracy, predictions as JSONL.

Decoding geometry (batch, prompt width, tokens to generate) is fixed per evaluator so the
jitted decoder compiles once for every split and every evaluation point. A prediction may
stop early at EOS or at `max_new` = the longest gold target + 1 + SLACK tokens: anything
longer than its gold target is wrong whatever follows, so decoding further cannot change
a score.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.exact_match import accuracy_by_type, exact_match
from ..data.finetune.seq2seq_readers import Example
from ..data.corpus.tokenizer import EOS_ID, PAD_ID, Tokenizer
from ..models.decoder import DecoderLM, generate
from ..models.trial_axis import Models

SLACK = 4


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Geometry:
    batch: int
    width: int  # prompt slots: [PAD, *source, EOS] right-padded
    max_new: int

    @classmethod
    def fit(cls, examples: Sequence[Example], tok: Tokenizer, batch: int) -> "Geometry":
        src = max(len(s) for s in tok.encode_batch([e.source for e in examples]))
        tgt = max(len(t) for t in tok.encode_batch([e.target for e in examples]))
        return cls(batch, _round_up(src + 2, 8), tgt + 1 + SLACK)


def prompts(examples: Sequence[Example], tok: Tokenizer,
            width: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, width] prompts `0 source EOS` (the decoder input of prefix_lm_features up to and
    including the source's EOS), right-padded, and their lengths."""
    ids = tok.encode_batch([e.source for e in examples])
    out = np.full((len(ids), width), PAD_ID, np.int32)
    lengths = np.asarray([len(s) + 2 for s in ids], np.int32)
    if lengths.max() > width:
        worst = int(np.argmax(lengths))
        raise ValueError(f"{examples[worst].where}: prompt of {lengths[worst]} tokens does not fit "
                         f"the decoder's width {width}")
    for i, s in enumerate(ids):
        out[i, 1:len(s) + 1] = s
        out[i, len(s) + 1] = EOS_ID
    return out, lengths


def _greedy(model: DecoderLM, prompt_BT, lengths_B, max_new: int):
    return generate(model, prompt_BT, lengths_B, max_new)


def predict(models: Models, tok: Tokenizer, examples: Sequence[Example],
            geo: Geometry) -> list[list[str]]:
    """Greedy predictions (text) for `examples`, in order, of each model (one list per trial;
    trials decode side by side, vmapped). Each device decodes its own prompts of a batch
    (or its own trials) and stops when they are done (Models.per_device)."""
    if not examples:
        return [[] for _ in range(len(models))]
    models = models.map(lambda model: model.with_options(dropout=0.0))
    arr, lengths = prompts(examples, tok, geo.width)
    n = len(examples)
    pad = -n % geo.batch  # fill the last batch with copies of the first prompt, then drop them
    arr = np.concatenate([arr, np.repeat(arr[:1], pad, 0)])
    lengths = np.concatenate([lengths, np.repeat(lengths[:1], pad)])
    outs = [models.per_device(_greedy, (arr[b:b + geo.batch], lengths[b:b + geo.batch]),
                              geo.max_new)
            for b in range(0, len(arr), geo.batch)]  # dispatch every batch before reading any
    texts = []
    for k in range(len(models)):
        tokens = np.concatenate([np.asarray(o[k]) for o in outs])[:n]
        rows = [row[:row.index(EOS_ID)] if EOS_ID in row else row for row in tokens.tolist()]
        texts.append([tok.decode(row) for row in rows])
    return texts


def score(examples: Sequence[Example], predictions: Sequence[str]) -> list[dict]:
    return [{"input": e.source, "gold": e.target, "prediction": p,
             "correct": exact_match(p, e.target), "type": e.type}
            for e, p in zip(examples, predictions)]


def evaluate_splits(models: Models, tok: Tokenizer, splits: dict[str, Sequence[Example]],
                    geo: Geometry) -> list[dict[str, list[dict]]]:
    """Each model's scored predictions of every split (one dict per trial)."""
    preds = {name: predict(models, tok, ex, geo) for name, ex in splits.items()}
    return [{name: score(ex, preds[name][k]) for name, ex in splits.items()}
            for k in range(len(models))]


def summarize(records: dict[str, list[dict]], dev_split: str | None,
              gen_splits: Sequence[str]) -> dict:
    """Accuracy of every split (overall, per type, lexical/structural), plus the headline
    numbers: `id_accuracy` (dev exact match) and `gen_accuracy`, `lexical`, `structural` over
    the generalization splits pooled."""
    out = {"accuracy": {name: accuracy_by_type(r) for name, r in records.items()}}
    if dev_split in records:
        out["id_accuracy"] = out["accuracy"][dev_split]["overall"]
    pooled = [r for s in gen_splits if s in records for r in records[s]]
    if pooled:
        gen = accuracy_by_type(pooled)
        out.update(gen_accuracy=gen["overall"], lexical=gen["lexical"],
                   structural=gen["structural"], by_type=gen["by_type"])
    return out


def write_predictions(directory: Path, records: dict[str, list[dict]], summary: dict) -> dict:
    """`<split>.jsonl` (input, gold, prediction, correct, type) and `summary.json`, each
    written to a temporary name and renamed, so an interrupted write leaves the old files."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in records.items():
        path = directory / f"{name}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)
        paths[name] = str(path)
    path = directory / "summary.json"
    path.with_suffix(".json.tmp").write_text(json.dumps(summary, indent=2))
    path.with_suffix(".json.tmp").replace(path)
    paths["summary"] = str(path)
    return paths
