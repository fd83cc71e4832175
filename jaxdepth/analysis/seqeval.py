"""Entity-span micro precision/recall/F1 for IOB2 tags, as seqeval computes it by default.

seqeval's default (non-strict) mode decodes spans like conlleval: a span starts at every B-X,
and also at an I-X that follows O or a tag of another type (an "ill-formed" I- still counts as
an entity rather than being dropped). A span ends where the next tag is O, a B-, or of another
type. Micro-averaging pools the spans of every sentence: a predicted span is correct only if a
gold span in the same sentence has the same type, start and end.
"""
from __future__ import annotations

from collections.abc import Sequence


def _parse(tag: str, where: str) -> tuple[str, str]:
    """(prefix, type) of an IOB2 tag; ('O', '') for O."""
    if tag == "O":
        return "O", ""
    if len(tag) > 2 and tag[0] in "BI" and tag[1] == "-":
        return tag[0], tag[2:]
    raise ValueError(f"{where}: invalid IOB2 tag {tag!r} (expected O, B-TYPE or I-TYPE)")


def spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entity spans (type, start, end) of one IOB2 sequence; end is exclusive."""
    out: set[tuple[str, int, int]] = set()
    start, cur_type = None, ""
    for i, tag in enumerate(tags):
        prefix, typ = _parse(tag, f"tag {i}")
        # Close the open span unless this tag continues it (an I- of the same type).
        if start is not None and not (prefix == "I" and typ == cur_type):
            out.add((cur_type, start, i))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, cur_type = i, typ
    if start is not None:
        out.add((cur_type, start, len(tags)))
    return out


def f1(gold_seqs: Sequence[Sequence[str]], pred_seqs: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 over all entity spans; 0.0 where a ratio is 0/0."""
    if len(gold_seqs) != len(pred_seqs):
        raise ValueError(f"{len(gold_seqs)} gold sequences but {len(pred_seqs)} predicted")
    n_gold = n_pred = n_correct = 0
    for i, (gold, pred) in enumerate(zip(gold_seqs, pred_seqs)):
        if len(gold) != len(pred):
            raise ValueError(f"sequence {i}: {len(gold)} gold tags but {len(pred)} predicted")
        g, p = spans(gold), spans(pred)
        n_gold += len(g)
        n_pred += len(p)
        n_correct += len(g & p)
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f}
