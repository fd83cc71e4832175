"""Entity-span micro precision/recall/F1 of IOB2 tag sequences, computed by the ``seqeval``
package, the scorer NER papers report with, in its default mode.

That mode decodes spans as conlleval does: a span starts at every B-X, and also at an I-X that
follows O or a tag of another type (an ill-formed I- still counts as an entity rather than being
dropped); it ends where the next tag is O, a B-, or of another type. Micro-averaging pools the
spans of every sentence: a predicted span is correct only if a gold span in the same sentence
has the same type, start and end. The tags are checked here first, so that a malformed tag is
named instead of being read as a type of its own.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..data.finetune.ner_sentences import check_tag


def f1(gold_seqs: Sequence[Sequence[str]], pred_seqs: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 over all entity spans; 0.0 where a ratio is 0/0."""
    if len(gold_seqs) != len(pred_seqs):
        raise ValueError(f"{len(gold_seqs)} gold sequences but {len(pred_seqs)} predicted")
    for i, (gold, pred) in enumerate(zip(gold_seqs, pred_seqs)):
        if len(gold) != len(pred):
            raise ValueError(f"sequence {i}: {len(gold)} gold tags but {len(pred)} predicted")
        for where, tags in (("gold", gold), ("predicted", pred)):
            for j, tag in enumerate(tags):
                check_tag(tag, f"{where} sequence {i}, tag {j}")
    # imported here: seqeval loads scikit-learn, scipy and pandas (about a second), which a
    # run that never scores NER should not pay at start-up
    from seqeval.metrics.sequence_labeling import precision_recall_fscore_support
    p, r, f, _ = precision_recall_fscore_support([list(g) for g in gold_seqs],
                                                 [list(p) for p in pred_seqs],
                                                 average="micro", zero_division=0)
    return {"precision": float(p), "recall": float(r), "f1": float(f)}
