"""Prefix-LM features for fine-tuning a decoder-only model on seq2seq tasks.

Semantics of t5x `DecoderOnlyModel` fed by seqio's `PrefixLMFeatureConverter` (unpacked):

    sequence = source EOS target EOS
    targets  = sequence, padded with 0 to `length`
    inputs   = targets shifted right by one, with 0 in front (the decoder input)
    weights  = 1.0 where targets[t] is a target token or the final EOS, else 0.0

Attention stays fully causal; the weights alone keep the loss off the source (and off the
source's EOS, which the model is given rather than asked to predict). `prefix_len` =
len(source) + 1 is the number of prefix tokens, so `weights` starts at index `prefix_len`, and
greedy decoding starts from the prompt `inputs[:prefix_len + 1]` = [0, *source, EOS].
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from jaxdepth.data.finetune.seq2seq_readers import Example
from jaxdepth.data.corpus.tokenizer import EOS_ID, PAD_ID, Tokenizer
from jaxdepth.errors import DataError


def prefix_lm_features(source_ids: Sequence[int], target_ids: Sequence[int], length: int,
                       eos_id: int = EOS_ID, *, truncate: bool = False,
                       name: str = "example") -> dict:
    """Features of one example as int32/float32 numpy arrays of shape [length], plus
    `prefix_len` (int) and `truncated` (bool).

    An example longer than `length` is an error naming it (`name`, e.g. "train.tsv:17"), because
    silently cut targets would be scored as wrong forever after. With `truncate=True` it is cut
    instead, in the manner of seqio's trim-then-append-EOS: both EOS tokens are kept, the source
    keeps its first tokens and shrinks first, and the target is cut only if it alone does not fit.
    """
    source, target = [int(i) for i in source_ids], [int(i) for i in target_ids]
    if length < 2:
        raise ValueError(f"length must be >= 2 (room for two EOS tokens), got {length}")
    for ids, part in ((source, "source"), (target, "target")):
        bad = [i for i in ids if i in (PAD_ID, eos_id)]
        if bad:
            # A PAD or EOS inside a part would be read as padding or a part boundary.
            raise DataError(f"{name}: {part} ids contain PAD/EOS ({bad[:3]})")
    if not target:
        raise DataError(f"{name}: empty target")
    needed = len(source) + len(target) + 2
    truncated = needed > length
    if truncated:
        if not truncate:
            raise DataError(f"{name}: source ({len(source)}) + target ({len(target)}) + 2 EOS "
                             f"= {needed} tokens do not fit in length {length} (raise "
                             f"data.seq_len, or set task.truncate to cut such examples)")
        room = length - 2
        target = target[:room]
        source = source[: room - len(target)]
    sequence = source + [eos_id] + target + [eos_id]
    n, prefix_len = len(sequence), len(source) + 1
    targets = np.zeros(length, dtype=np.int32)
    targets[:n] = sequence
    inputs = np.zeros(length, dtype=np.int32)
    inputs[1:n + 1] = sequence[: length - 1]  # the last token is never fed back in
    weights = np.zeros(length, dtype=np.float32)
    weights[prefix_len:n] = 1.0
    return {"inputs": inputs, "targets": targets, "weights": weights,
            "prefix_len": prefix_len, "truncated": truncated}


def _example_features(examples: Sequence[Example], tok: Tokenizer, length_of, truncate: bool,
                      caller: str) -> list[dict]:
    """prefix_lm_features of each example, at length ``length_of(source ids, target ids)``."""
    if not examples:
        raise ValueError(f"{caller} needs at least one example")
    sources = tok.encode_batch([e.source for e in examples])
    targets = tok.encode_batch([e.target for e in examples])
    return [prefix_lm_features(s, t, length_of(s, t), tok.eos_id, truncate=truncate, name=e.where)
            for e, s, t in zip(examples, sources, targets)]


def batch_features(examples: Sequence[Example], tok: Tokenizer, length: int, *,
                   truncate: bool = False) -> dict[str, np.ndarray]:
    """Stacked features of `examples`: `inputs`, `targets` (int32 [B, length]), `weights`
    (float32 [B, length]), `prefix_len` (int32 [B]) and `truncated` (int32 [B], 1 where the
    example was cut; `batch["truncated"].sum()` counts them)."""
    rows = _example_features(examples, tok, lambda s, t: length, truncate, "batch_features")
    out = {k: np.stack([r[k] for r in rows]) for k in ("inputs", "targets", "weights")}
    for k in ("prefix_len", "truncated"):
        out[k] = np.asarray([r[k] for r in rows], dtype=np.int32)
    return out


def pack_features(examples: Sequence[Example], tok: Tokenizer, length: int, seed: int, *,
                  truncate: bool = False) -> dict[str, np.ndarray]:
    """Training features with several examples per row (seqio's PrefixLMFeatureConverter with
    pack=True): `inputs`, `targets`, `weights` and `segment_ids` ([R, length]; segment ids 1, 2,
    ... per example in a row, 0 on padding).

    Each segment holds exactly the unpacked features of its example (`prefix_lm_features` at
    the example's own length), so with attention kept inside segments and a relative-position
    bias, which does not see where a segment starts, its loss equals the unpacked loss. Rows are
    filled best-fit over a permutation of the examples drawn with `seed`: the packing is a
    function of (examples, length, seed), and an example's neighbours are not its file
    neighbours (files are often sorted by type or length).
    """
    parts = _example_features(examples, tok, lambda s, t: min(len(s) + len(t) + 2, length),
                              truncate, "pack_features")
    # Best fit: rows by free room; an example goes to the row with the least room that holds it.
    rows: list[list[int]] = []
    by_room: list[list[int]] = [[] for _ in range(length + 1)]
    for i in np.random.default_rng(seed).permutation(len(parts)).tolist():
        n = len(parts[i]["targets"])
        room = next((r for r in range(n, length + 1) if by_room[r]), None)
        if room is None:
            rows.append([])
            row, room = len(rows) - 1, length
        else:
            row = by_room[room].pop()
        rows[row].append(i)
        by_room[room - n].append(row)
    out = {"inputs": np.zeros((len(rows), length), np.int32),
           "targets": np.zeros((len(rows), length), np.int32),
           "weights": np.zeros((len(rows), length), np.float32),
           "segment_ids": np.zeros((len(rows), length), np.int32)}
    for r, members in enumerate(rows):
        at = 0
        for seg, i in enumerate(members, start=1):
            f = parts[i]
            n = len(f["targets"])
            for k in ("inputs", "targets", "weights"):
                out[k][r, at:at + n] = f[k]
            out["segment_ids"][r, at:at + n] = seg
            at += n
    return out


@dataclass
class UnkReport:
    """How a tokenizer copes with a task's text. `unknown_words` counts the whitespace words
    whose encoding contains unk, so a user sees *what* is lost (e.g. an upper-case letter or a
    symbol missing from the pretraining corpus) rather than a silently mangled target."""

    n_examples: int = 0
    examples_with_unk: int = 0
    source_unk_tokens: int = 0
    target_unk_tokens: int = 0
    unknown_words: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return self.examples_with_unk == 0


def count_unk(examples: Sequence[Example], tok: Tokenizer) -> UnkReport:
    report = UnkReport(n_examples=len(examples))
    for e in examples:
        src, tgt = tok.count_unk(e.source), tok.count_unk(e.target)
        report.source_unk_tokens += src
        report.target_unk_tokens += tgt
        if src or tgt:
            report.examples_with_unk += 1
            for word in (e.source + " " + e.target).split():
                if tok.count_unk(word):
                    report.unknown_words[word] += 1
    return report
