"""Pack tokenized documents into fixed-length LM windows, seqio-style, with segment ids.

A window holds T tokens taken from the documents in order (each document's ids followed by
EOS); a document longer than what is left of a window continues as a new segment of the next,
so no window of a stream has padding. The features are seqio's
``DecoderFeatureConverter(pack=True)``'s (`features`; docs/design.md §5, "Packing"), so a model
that attends only inside a segment (``DecoderLM(..., segment_ids_BT=...)``) sees every document
exactly as if it sat alone at the start of a window.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .tokenizer import EOS_ID

# A document source: () -> the next document's token ids (EOS appended) as int32, never empty.
NextDocument = Callable[[], np.ndarray]


def features(tokens_T: np.ndarray, segment_ids_T: np.ndarray) -> dict[str, np.ndarray]:
    """The LM features of one packed window: `targets` its tokens; `inputs` them shifted right
    by one within each segment, 0 at a segment's start; `segment_ids`; `positions` restarting
    at 0 in every segment; `weights` 1.0 on real tokens. Padding (segment 0) is 0 throughout."""
    T = len(tokens_T)
    starts = np.ones(T, bool)
    starts[1:] = segment_ids_T[1:] != segment_ids_T[:-1]
    idx = np.arange(T)
    positions = idx - np.maximum.accumulate(np.where(starts, idx, 0))
    inputs = np.zeros(T, np.int32)
    inputs[1:] = tokens_T[:-1]
    inputs[starts] = 0
    real = segment_ids_T > 0
    return {"inputs": np.where(real, inputs, 0).astype(np.int32),
            "targets": np.where(real, tokens_T, 0).astype(np.int32),
            "segment_ids": segment_ids_T.astype(np.int32),
            "positions": np.where(real, positions, 0).astype(np.int32),
            "weights": real.astype(np.float32)}


class WindowPacker:
    """Fills windows of `seq_len` tokens from a document source, carrying the rest of a
    document that does not fit over to the next window.

    ``doc``/``offset`` (the document being consumed and how many of its tokens are already
    packed) are all the state between windows; a stream checkpoints where that document
    starts in its file plus ``offset`` and re-tokenizes it on restore."""

    def __init__(self, seq_len: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.seq_len = seq_len
        self.doc = np.zeros((0,), np.int32)
        self.offset = 0

    def window(self, next_document: NextDocument) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [T], segment ids [T]) of the next window: full, unless `next_document`
        returns None (the data ended), which leaves the rest padding (segment 0)."""
        T = self.seq_len
        tokens, segs = np.zeros(T, np.int32), np.zeros(T, np.int32)
        filled, seg = 0, 0
        while filled < T:
            if self.offset >= len(self.doc):
                doc = next_document()
                if doc is None:
                    break
                self.doc, self.offset = doc, 0
            take = min(T - filled, len(self.doc) - self.offset)
            seg += 1
            tokens[filled:filled + take] = self.doc[self.offset:self.offset + take]
            segs[filled:filled + take] = seg
            filled += take
            self.offset += take
        return tokens, segs


def document_ids(ids: list[int]) -> np.ndarray:
    """A document's ids followed by EOS, as packed."""
    return np.asarray([*ids, EOS_ID], np.int32)


def iter_windows(docs: Iterator[np.ndarray], seq_len: int) -> Iterator[dict[str, np.ndarray]]:
    """Pack a finite sequence of documents (evaluation), lazily: every window full but the
    last, which is padded. A consumer that stops early reads no more documents than the
    windows it took need."""
    packer, pending = WindowPacker(seq_len), iter(docs)
    while True:
        tokens, segs = packer.window(lambda: next(pending, None))
        if not segs.any():
            return
        yield features(tokens, segs)
        if not segs.all():
            return
