"""Language-model data pipeline: one token stream cut into windows, batched by `grain`.

Batch `i` is a pure function of `(seed, i)`: the stream is cut into W non-overlapping windows of
T+1 tokens (window k = tokens[k*T : k*T+T+1]); epoch e visits them in the order
`perm_e = np.random.default_rng([seed, e]).permutation(W)`; global sample s = i*B + r is window
`perm_{s // W}[s % W]`. Process p of P reads rows [p*B/P, (p+1)*B/P) of every global batch, so a
run resumes exactly from the batch index alone and the processes together read each global batch
once, in order.
"""
from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import grain
import numpy as np

from jaxdepth.data.corpus.tokenizer import EOS_ID, Tokenizer
from jaxdepth.errors import DataError, writing

# Training is step-limited, so the dataset is (practically) infinite; len() must stay below
# sys.maxsize = 2**63 - 1.
_INFINITE = 2**62


def tokenize_documents(docs: Sequence[str], tok: Tokenizer) -> np.ndarray:
    """One flat int32 stream: every document's ids followed by EOS."""
    pieces = []
    chunk = 4096  # bounds peak memory of the Python lists on large corpora
    for start in range(0, len(docs), chunk):
        for ids in tok.encode_batch(docs[start : start + chunk]):
            pieces.append(np.asarray(ids + [EOS_ID], dtype=np.int32))
    if not pieces:
        return np.zeros((0,), dtype=np.int32)
    return np.concatenate(pieces)


def save_tokens(path: str | Path, tokens: np.ndarray) -> None:
    """Write `tokens` as an int32 `.npy` file at exactly `path`, atomically.

    Other processes may be waiting to memory-map the file, so they must never see it half written.
    """
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    try:
        with writing(path), tmp.open("wb") as f:
            # np.save's bytes, written through the file object: numpy's own writer reports a
            # short write (a full disk) without its errno.
            header = np.lib.format.header_data_from_array_1_0(tokens)
            np.lib.format.write_array_header_1_0(f, header)
            f.write(memoryview(tokens).cast("B"))
        os.replace(tmp, path)
    except BaseException:  # a full disk: leave no partial file behind
        tmp.unlink(missing_ok=True)
        raise


def load_tokens(path: str | Path) -> np.ndarray:
    """Memory-map a token file written by `save_tokens`; only the windows read are paged in."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"token file not found: {path}")
    try:
        tokens = np.load(path, mmap_mode="r")
    except ValueError as e:
        raise DataError(f"{path} is not a .npy token file ({e})") from None
    if tokens.ndim != 1 or tokens.dtype != np.int32:
        raise DataError(
            f"{path}: expected a 1-D int32 token array, got {tokens.dtype} of shape {tokens.shape}"
        )
    return tokens


@functools.lru_cache(maxsize=8)
def _epoch_permutation(seed: int, epoch: int, n_windows: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n_windows)
    perm.flags.writeable = False  # shared by every caller through the cache
    return perm


def sample_ids(seed: int, n: int, first: int, count: int) -> np.ndarray:
    """Items of global samples first .. first+count-1 when epoch e visits n items in the order
    _epoch_permutation(seed, e, n)."""
    # Python ints: i * global_batch may exceed int64, and one slice may span epochs.
    parts, at, end = [], first, first + count
    while at < end:
        epoch, k = divmod(at, n)
        take = min(n - k, end - at)
        parts.append(_epoch_permutation(seed, epoch, n)[k:k + take])
        at += take
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def process_rows(global_batch: int, seed: int, process_index: int,
                 process_count: int) -> tuple[int, int]:
    """(rows per process, this process's first row) of a global batch split over processes;
    bad arguments are a ValueError naming them."""
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1, got {global_batch}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"bad process_index={process_index} of process_count={process_count}")
    if global_batch % process_count:
        raise ValueError(
            f"global_batch={global_batch} is not divisible by process_count={process_count}")
    local = global_batch // process_count
    return local, process_index * local


class _EpochRows:
    """Random-access grain source over `n` items: item i is this process's rows of global
    batch i, the items drawn epoch by epoch (`sample_ids`), so batch i is a pure function of
    (seed, i)."""

    def __init__(self, n: int, *, global_batch: int, seed: int, process_index: int = 0,
                 process_count: int = 1):
        self.local_batch, self.first_row = process_rows(global_batch, seed, process_index,
                                                        process_count)
        self.n, self.global_batch, self.seed = n, global_batch, seed

    def __len__(self) -> int:
        return _INFINITE

    def rows(self, i: int) -> np.ndarray:
        """The item indices of this process's rows of global batch i."""
        if not 0 <= i < _INFINITE:
            raise IndexError(f"batch index {i} out of range")
        return sample_ids(self.seed, self.n, int(i) * self.global_batch + self.first_row,
                          self.local_batch)


class LMBatchSource(_EpochRows):
    """Item i is this process's slice of global batch i, its rows windows of the stream."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, **rows):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D stream, got shape {tokens.shape}")
        n_windows = (len(tokens) - 1) // seq_len
        super().__init__(n_windows, **rows)
        if n_windows < self.global_batch:
            raise ValueError(
                f"{len(tokens)} tokens make {max(n_windows, 0)} windows of seq_len={seq_len}, "
                f"fewer than global_batch={self.global_batch}; need at least "
                f"{self.global_batch * seq_len + 1} tokens"
            )
        self.tokens = tokens
        self.seq_len = seq_len

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        starts = self.rows(i) * self.seq_len
        # One fancy-index gather: a memmap reads just these windows' pages.
        windows = np.asarray(self.tokens[starts[:, None] + np.arange(self.seq_len + 1)],
                             dtype=np.int32)
        return {
            "inputs": windows[:, :-1],
            "targets": windows[:, 1:],
            "weights": np.ones(windows[:, 1:].shape, dtype=np.float32),
        }


class ExampleBatchSource(_EpochRows):
    """Item i is this process's rows of global batch i of fixed-length examples (e.g.
    prefix-LM features), drawn exactly like the windows of LMBatchSource."""

    def __init__(self, arrays: dict[str, np.ndarray], **rows):
        n = {len(v) for v in arrays.values()}
        if len(n) != 1 or not n.pop():
            raise ValueError(f"arrays must be non-empty with one common length, got "
                             f"{ {k: len(v) for k, v in arrays.items()} }")
        super().__init__(len(next(iter(arrays.values()))), **rows)
        self.arrays = arrays

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        ids = self.rows(i)
        return {k: v[ids] for k, v in self.arrays.items()}


def lm_dataset(tokens: np.ndarray, **source) -> grain.MapDataset:
    """grain dataset whose item i is this process's [global_batch/process_count, seq_len] batch
    (`source`: LMBatchSource's seq_len, global_batch, seed, process_index, process_count)."""
    return grain.MapDataset.source(LMBatchSource(tokens, **source))


def lm_iterator(dataset: grain.MapDataset | grain.IterDataset, start: int = 0,
                prefetch: int = 2) -> grain.DatasetIterator:
    """Iterator over `dataset` from batch `start`, prefetching `prefetch` batches in a thread.

    Its state ({"next_index": i}) is checkpointed with `get_state`/`set_state` or orbax through
    `grain.checkpoint.CheckpointSave`/`CheckpointRestore`. A streamed dataset (an IterDataset,
    data/corpus/streaming.py) prefetches on its own and has its own state; it starts at batch 0.
    """
    if isinstance(dataset, grain.IterDataset):
        if start:
            raise ValueError("a streamed dataset is positioned by its saved state, not by an index")
        return iter(dataset)
    options = grain.ReadOptions(num_threads=1 if prefetch > 0 else 0, prefetch_buffer_size=prefetch)
    it = iter(dataset.to_iter_dataset(options))
    if start:
        state = it.get_state()
        if set(state) != {"next_index"}:
            raise TypeError(f"unexpected grain iterator state {state}; cannot seek to {start}")
        it.set_state({"next_index": int(start)})
    return it


def eval_batches(tokens: np.ndarray, *, seq_len: int,
                 batch_size: int) -> list[dict[str, np.ndarray]]:
    """Sequential, non-overlapping windows that score every predictable token exactly once.

    The last window and the last batch are padded with zeros whose `weights` are 0, so
    perplexity is exp(sum(loss * weights) / sum(weights)).
    """
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
    n_predicted = len(tokens) - 1
    if n_predicted < 1:
        raise ValueError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    n_windows = -(-n_predicted // seq_len)
    n_rows = -(-n_windows // batch_size) * batch_size
    # Zero-pad the stream so it reshapes into whole rows; every position past the last real
    # target is padding (inputs, targets and weights 0).
    padded = np.zeros(n_rows * seq_len + 1, dtype=np.int32)
    padded[: len(tokens)] = tokens
    real = (np.arange(n_rows * seq_len) < n_predicted).reshape(n_rows, seq_len)
    inputs = np.where(real, padded[:-1].reshape(n_rows, seq_len), 0)
    targets = padded[1:].reshape(n_rows, seq_len)
    weights = real.astype(np.float32)
    return [
        {
            "inputs": inputs[b : b + batch_size],
            "targets": targets[b : b + batch_size],
            "weights": weights[b : b + batch_size],
        }
        for b in range(0, n_rows, batch_size)
    ]


def window_batches(windows: Iterable[dict[str, np.ndarray]], batch_size: int,
                   max_batches: int = 0,
                   keys: Sequence[str] = ("inputs", "targets", "weights", "segment_ids")
                   ) -> list[dict[str, np.ndarray]]:
    """Packed windows (data/corpus/packing.py) in batches of `batch_size` rows, consumed lazily and
    at most `max_batches` of them (all when 0); the last batch is filled with all-padding
    rows (weights 0), so every batch has one shape."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out, pending = [], iter(windows)
    while not max_batches or len(out) < max_batches:
        rows = list(itertools.islice(pending, batch_size))
        if not rows:
            break
        batch = {k: np.stack([w[k] for w in rows]) for k in keys}
        if len(rows) < batch_size:
            batch = {k: np.concatenate(
                [v, np.zeros((batch_size - len(rows), *v.shape[1:]), v.dtype)])
                     for k, v in batch.items()}
        out.append(batch)
    return out


def split_documents(
    docs: Sequence[str], valid_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """Random train/validation split of documents, each side kept in corpus order.

    When valid_fraction > 0 and there are at least two documents, both sides are non-empty; a
    single document always goes to training.
    """
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    n = len(docs)
    n_valid = int(valid_fraction * n + 0.5)  # round half up
    if valid_fraction > 0:
        n_valid = max(n_valid, 1)
    n_valid = min(n_valid, max(n - 1, 0))  # never leave training without a document
    is_valid = np.zeros(n, dtype=bool)
    is_valid[np.random.default_rng(seed).permutation(n)[:n_valid]] = True
    train = [d for d, v in zip(docs, is_valid) if not v]
    valid = [d for d, v in zip(docs, is_valid) if v]
    return train, valid
