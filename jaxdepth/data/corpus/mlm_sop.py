"""ALBERT-style pretraining data: n-gram masked LM + sentence-order prediction (SOP).

This follows ALBERT's `create_pretraining_data.py` as used by Simoulin & Crabbé, but builds every
example on the fly, so batch `i` is a pure function of `(seed, i)` like the LM pipeline
(`pipeline.py`): row r of global batch i is built from `np.random.default_rng([seed, i, r])`, and
process p of P reads rows [p*B/P, (p+1)*B/P). Documents are lists of sentences
(`grammar_documents`, `text_documents`); `tokenize_mlm_documents` encodes every sentence once and
keeps the documents with at least two sentences (SOP needs two segments from one document).
How one example is made (`_make_example`, steps 1-6) and the differences from ALBERT:
docs/design.md §3.7.

A batch is a dict of numpy arrays, B rows each (T = seq_len, P = max_predictions):

    tokens        int32 [B, T]   model input (after masking)
    segments      int32 [B, T]   0 for [CLS] A [SEP] and padding, 1 for B [SEP]
    mask          int32 [B, T]   1 on real tokens, 0 on padding
    mask_kind     int32 [B, T]   0 not selected, 1 [MASK/MASK], 2 [MASK/random], 3 [MASK/original]
    mlm_positions int32 [B, P]   selected positions, ascending; 0 in unused slots
    mlm_ids       int32 [B, P]   original ids at those positions; 0 in unused slots
    mlm_weights   float32 [B, P] 1 for used slots, 0 for unused
    sop_labels    int32 [B]      1 when A and B were swapped
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grain
import numpy as np

from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus.pipeline import _INFINITE, process_rows
from jaxdepth.data.corpus.readers import read_corpus
from jaxdepth.models.specs import MLMConfig
from jaxdepth.data.corpus.tokenizer import Tokenizer

KIND_NONE, KIND_MASK, KIND_RANDOM, KIND_ORIGINAL = 0, 1, 2, 3

# ---------------------------------------------------------------------------------------------
# Documents as lists of sentences.


def grammar_documents(n_docs: int, seed: int,
                      sents_per_doc: tuple[int, int] = (3, 8)) -> list[list[str]]:
    """Documents of the embedded grammar, each a list of sentence texts (words joined by " ")."""
    return [[" ".join(s.words) for s in doc]
            for doc in grammar.corpus(n_docs, seed, sents_per_doc)]


# A sentence ends at ".", "?" or "!" followed by whitespace (WikiText's " . " and ordinary
# "end. Next" alike). Deliberately simple: abbreviations ("Mr. Smith") also split, decimals
# ("3.5", WikiText's "3 @.@ 5") do not.
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
# WikiText headings: " = Title = ", " = = Section = = ".
_HEADING = re.compile(r"^\s*(=\s+)+\S.*?(\s+=)+\s*$")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, split after ".", "?" or "!" + whitespace; empty ones dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def text_documents(paths: Sequence[str | Path], fmt: str = "auto") -> list[list[str]]:
    """Documents of plain-text / WikiText / JSONL ({"text"}) files, each a list of sentences.

    Files are read with `readers.read_corpus` (plain text: blocks separated by blank lines; JSONL:
    one record per document). Inside a document, a WikiText heading line (" = Title = ",
    " = = Section = = ") ends the current document and is dropped, so a WikiText paragraph is one
    document. The remaining lines of a document are joined with spaces and cut by
    `split_sentences`. Documents without sentences are dropped.
    """
    out: list[list[str]] = []
    for doc in read_corpus(paths, fmt):
        current: list[str] = []
        for line in doc.split("\n"):
            if _HEADING.match(line):
                if current:
                    out.append(current)
                current = []
            else:
                current.extend(split_sentences(line))
        if current:
            out.append(current)
    return out


# ---------------------------------------------------------------------------------------------
# Tokenized documents, stored flat.


@dataclass(frozen=True, eq=False)
class MLMDocuments:
    """Tokenized documents of >= 2 sentences, stored as flat arrays.

    Sentence s is `tokens[sent_offsets[s]:sent_offsets[s + 1]]`; document d holds sentences
    `doc_offsets[d]` .. `doc_offsets[d + 1] - 1`. `word_start[j]` says whether token j starts a
    word (candidate unit of n-gram masking).
    """

    tokens: np.ndarray  # int32 [n_tokens]
    word_start: np.ndarray  # bool [n_tokens]
    sent_offsets: np.ndarray  # int64 [n_sentences + 1]
    doc_offsets: np.ndarray  # int64 [n_docs + 1]

    @property
    def n_docs(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def n_sentences(self) -> int:
        return len(self.sent_offsets) - 1

    def sentence(self, s: int) -> np.ndarray:
        return self.tokens[self.sent_offsets[s]:self.sent_offsets[s + 1]]

    @property
    def max_id(self) -> int:
        return int(self.tokens.max())

    @classmethod
    def from_ids(cls, docs: Sequence[Sequence[Sequence[int]]],
                 word_start_table: np.ndarray | None = None) -> MLMDocuments:
        """From documents of sentences of token ids. Empty sentences are dropped, then documents
        with fewer than 2 sentences. `word_start_table[id]` says whether a token id starts a word
        (see `word_start_table`); None makes every token its own word."""
        kept = []
        for doc in docs:
            sents = [np.asarray(s, dtype=np.int32) for s in doc if len(s)]
            if len(sents) >= 2:
                kept.append(sents)
        if not kept:
            raise ValueError(
                f"no document with >= 2 non-empty sentences among {len(docs)} documents: "
                "sentence-order prediction needs two segments from one document")
        sents = [s for doc in kept for s in doc]
        tokens = np.concatenate(sents)
        if tokens.min() < 0:
            raise ValueError("token ids must be >= 0")
        if word_start_table is None:
            word_start = np.ones(len(tokens), dtype=bool)
        else:
            table = np.asarray(word_start_table, dtype=bool)
            if tokens.max() >= len(table):
                raise ValueError(f"token id {tokens.max()} outside word_start_table of size "
                                 f"{len(table)}")
            word_start = table[tokens]
        sent_offsets = np.concatenate([[0], np.cumsum([len(s) for s in sents])]).astype(np.int64)
        doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in kept])]).astype(np.int64)
        return cls(tokens, word_start, sent_offsets, doc_offsets)


def word_start_table(tok: Tokenizer) -> np.ndarray:
    """bool [vocab_size]: whether the piece of each id starts a word (begins with "▁"); a
    tokenizer with its own notion (data/corpus/subwords.py:HFWords) provides
    ``word_start_table()``."""
    if hasattr(tok, "word_start_table"):
        return tok.word_start_table()
    return np.array([tok.id_to_piece(i).startswith("\u2581") for i in range(tok.vocab_size)],
                    dtype=bool)


def tokenize_mlm_documents(docs: Sequence[Sequence[str]], tok: Tokenizer) -> MLMDocuments:
    """Encode every sentence once (one `encode_batch` call) and keep documents of >= 2 sentences.

    Raises ValueError when no such document remains.
    """
    flat = [s for doc in docs for s in doc]
    ids = tok.encode_batch(flat) if flat else []
    nested, k = [], 0
    for doc in docs:
        nested.append(ids[k:k + len(doc)])
        k += len(doc)
    return MLMDocuments.from_ids(nested, word_start_table(tok))


# ---------------------------------------------------------------------------------------------
# Configuration and example construction.


@dataclass(frozen=True)
class NGram:
    """One masked n-gram: token positions [start, end) covering `n_words` whole words.

    `n_drawn` is the length drawn ∝ 1/n over 1..`n_avail` (the words left in the segment, capped
    at max_ngram); `n_words` < `n_drawn` when it was shortened to fit the prediction budget.
    """

    start: int
    end: int
    n_drawn: int
    n_words: int
    n_avail: int


@dataclass(frozen=True)
class MLMExampleInfo:
    """How an example was made (for tests and inspection)."""

    doc: int  # index into MLMDocuments
    first_sentences: tuple[int, ...]  # document-relative indices of the sentences of segment 0
    second_sentences: tuple[int, ...]  # ... and of segment 1 (before truncation)
    original: np.ndarray  # int32 [T]: the tokens before masking
    n_to_predict: int  # the prediction budget
    ngrams: tuple[NGram, ...]  # in selection order


def _sop_starts(docs: MLMDocuments) -> np.ndarray:
    """Global indices of the sentences that are not the last of their document."""
    last = docs.doc_offsets[1:] - 1
    keep = np.ones(docs.n_sentences, dtype=bool)
    keep[last] = False
    return np.flatnonzero(keep)


@functools.lru_cache(maxsize=16)
def _ngram_cdfs(max_ngram: int) -> tuple[np.ndarray, ...]:
    """cdfs[a] = cumulative p(n) ∝ 1/n over n = 1..a (index 0 unused)."""
    cdfs = [np.ones(1)]
    for a in range(1, max_ngram + 1):
        p = 1.0 / np.arange(1, a + 1)
        cdfs.append(np.cumsum(p / p.sum()))
    return tuple(cdfs)


def _make_example(docs: MLMDocuments, cfg: MLMConfig, vocab_size: int, rng: np.random.Generator,
                  starts: np.ndarray) -> tuple[dict[str, np.ndarray], MLMExampleInfo]:
    T, max_tokens = cfg.seq_len, cfg.seq_len - 3
    so = docs.sent_offsets

    # 1-2. Start sentence, target length, chunk of >= 2 sentences, split point.
    s0 = int(starts[rng.integers(len(starts))])
    d = int(np.searchsorted(docs.doc_offsets, s0, side="right")) - 1
    doc_first, doc_end = int(docs.doc_offsets[d]), int(docs.doc_offsets[d + 1])
    target = max_tokens
    if rng.random() < cfg.short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    s1 = s0 + 2
    while s1 < doc_end and so[s1] - so[s0] < target:
        s1 += 1
    a_end = int(rng.integers(s0 + 1, s1))
    a = (int(so[s0]), int(so[a_end]), tuple(range(s0 - doc_first, a_end - doc_first)))
    b = (int(so[a_end]), int(so[s1]), tuple(range(a_end - doc_first, s1 - doc_first)))

    # 3. Sentence order.
    label = int(cfg.sop and rng.random() < 0.5)
    (lo1, hi1, sents1), (lo2, hi2, sents2) = (b, a) if label else (a, b)

    # 4. ALBERT's truncate_seq_pair: one token at a time from the longer segment (the second on
    # a tie), front or back at random.
    excess = (hi1 - lo1) + (hi2 - lo2) - max_tokens
    if excess > 0:
        for front in (rng.random(excess) < 0.5).tolist():
            if hi1 - lo1 > hi2 - lo2:
                lo1, hi1 = (lo1 + 1, hi1) if front else (lo1, hi1 - 1)
            else:
                lo2, hi2 = (lo2 + 1, hi2) if front else (lo2, hi2 - 1)
    n1, n2 = hi1 - lo1, hi2 - lo2
    length = n1 + n2 + 3

    tokens = np.zeros(T, dtype=np.int32)
    tokens[0] = cfg.cls_id
    tokens[1:1 + n1] = docs.tokens[lo1:hi1]
    tokens[1 + n1] = cfg.sep_id
    tokens[2 + n1:2 + n1 + n2] = docs.tokens[lo2:hi2]
    tokens[2 + n1 + n2] = cfg.sep_id
    segments = np.zeros(T, dtype=np.int32)
    segments[2 + n1:length] = 1
    mask = np.zeros(T, dtype=np.int32)
    mask[:length] = 1

    # 5. Whole words of each segment (a segment's first token always starts a word).
    ws1 = docs.word_start[lo1:hi1].copy()
    ws1[0] = True
    ws2 = docs.word_start[lo2:hi2].copy()
    ws2[0] = True
    p1 = (1 + np.flatnonzero(ws1)).tolist()
    p2 = (2 + n1 + np.flatnonzero(ws2)).tolist()
    word_lo = p1 + p2
    word_hi = p1[1:] + [1 + n1] + p2[1:] + [2 + n1 + n2]
    seg_end = [len(p1)] * len(p1) + [len(p1) + len(p2)] * len(p2)  # first word after the segment
    n_words = len(word_lo)

    budget = min(cfg.max_predictions, max(1, int(cfg.mask_rate * (n1 + n2) + 0.5)))
    cdfs = _ngram_cdfs(cfg.max_ngram)
    order = rng.permutation(n_words).tolist()
    draws = rng.random(n_words).tolist()
    covered = [False] * n_words
    ngrams: list[NGram] = []
    count = 0
    for k in order:
        if count >= budget:
            break
        avail = min(cfg.max_ngram, seg_end[k] - k)
        n_drawn = int(np.searchsorted(cdfs[avail], draws[k], side="right")) + 1
        n_drawn = min(n_drawn, avail)  # guards against cdf[-1] rounding below 1
        n = n_drawn
        while n > 0 and count + word_hi[k + n - 1] - word_lo[k] > budget:
            n -= 1
        if n == 0 or any(covered[k:k + n]):
            continue
        covered[k:k + n] = [True] * n
        count += word_hi[k + n - 1] - word_lo[k]
        ngrams.append(NGram(word_lo[k], word_hi[k + n - 1], n_drawn, n, avail))

    # 6. Per-token replacement.
    positions = np.sort(np.concatenate(
        [np.arange(g.start, g.end) for g in ngrams] or [np.zeros(0, np.int64)])).astype(np.int32)
    m = len(positions)
    u = rng.random(m)
    random_ids = rng.integers(cfg.first_random_id, vocab_size, size=m).astype(np.int32)
    kind = np.where(u < cfg.p_mask, KIND_MASK,
                    np.where(u < cfg.p_mask + cfg.p_random, KIND_RANDOM, KIND_ORIGINAL))
    original = tokens.copy()
    tokens[positions] = np.where(kind == KIND_MASK, cfg.mask_id,
                                 np.where(kind == KIND_RANDOM, random_ids, original[positions]))
    mask_kind = np.zeros(T, dtype=np.int32)
    mask_kind[positions] = kind

    unused = (0, cfg.max_predictions - m)  # slots past the m predictions: 0
    example = {
        "tokens": tokens,
        "segments": segments,
        "mask": mask,
        "mask_kind": mask_kind,
        "mlm_positions": np.pad(positions, unused),
        "mlm_ids": np.pad(original[positions], unused),
        "mlm_weights": np.pad(np.ones(m, np.float32), unused),
        "sop_labels": np.asarray(label, dtype=np.int32),
    }
    info = MLMExampleInfo(d, sents1, sents2, original, budget, tuple(ngrams))
    return example, info


# ---------------------------------------------------------------------------------------------
# grain source.


class MLMBatchSource:
    """Random-access grain source: item i is this process's rows of global batch i.

    Row r of global batch i is made with `np.random.default_rng([seed, i, r])`, so a batch is a
    pure function of (seed, i) and process p of P reads rows [p*B/P, (p+1)*B/P). `docs_tokenized`
    is an `MLMDocuments` (or nested lists of sentence ids, every token then its own word).
    """

    def __init__(self, docs_tokenized, cfg: MLMConfig, vocab_size: int, *, global_batch: int,
                 seed: int, process_index: int = 0, process_count: int = 1):
        self.local_batch, self.first_row = process_rows(global_batch, seed, process_index,
                                                        process_count)
        self.docs = (docs_tokenized if isinstance(docs_tokenized, MLMDocuments)
                     else MLMDocuments.from_ids(docs_tokenized))
        if vocab_size <= cfg.first_random_id:
            raise ValueError(f"vocab_size={vocab_size} must exceed the {cfg.first_random_id} "
                             f"special ids")
        if self.docs.max_id >= vocab_size:
            raise ValueError(f"token id {self.docs.max_id} is outside vocab_size={vocab_size}")
        self.cfg = cfg
        self.vocab_size = int(vocab_size)
        self.seed = seed
        self._starts = _sop_starts(self.docs)

    def __len__(self) -> int:
        return _INFINITE

    def example(self, i: int, row: int) -> tuple[dict[str, np.ndarray], MLMExampleInfo]:
        """Global row `row` of batch `i`, with its debug info."""
        rng = np.random.default_rng([self.seed, int(i), int(row)])
        return _make_example(self.docs, self.cfg, self.vocab_size, rng, self._starts)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < _INFINITE:
            raise IndexError(f"batch index {i} out of range")
        rows = [self.example(i, self.first_row + r)[0] for r in range(self.local_batch)]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def mlm_dataset(docs_tokenized, cfg: MLMConfig, vocab_size: int, **source) -> grain.MapDataset:
    """grain dataset whose item i is this process's rows of global MLM+SOP batch i (`source`:
    MLMBatchSource's global_batch, seed, process_index, process_count; iterate it with
    `pipeline.lm_iterator`)."""
    return grain.MapDataset.source(MLMBatchSource(docs_tokenized, cfg, vocab_size, **source))


def eval_mlm_batches(docs_tokenized, cfg: MLMConfig, vocab_size: int, *, n_batches: int,
                     batch_size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """A fixed list of `n_batches` validation batches: batches 0..n_batches-1 of
    `MLMBatchSource(..., global_batch=batch_size, seed=seed)`."""
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    source = MLMBatchSource(docs_tokenized, cfg, vocab_size, global_batch=batch_size, seed=seed)
    return [source[i] for i in range(n_batches)]
