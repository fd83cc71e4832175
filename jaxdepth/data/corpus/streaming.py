"""A corpus of many files streamed into packed LM batches, tokenized on the fly (C4 scale).

Start-up and memory do not depend on the corpus size: nothing is read before the first batch
is asked for, and each stream holds one open file and one document.

The sorted file list is dealt into S *streams* (``data.streams``); stream s reads files s, s+S,
... in a seeded order every epoch, tokenizes them and packs them into windows
(data/corpus/packing.py). Global batch i holds, stream after stream, R = global_batch / S rows
of each stream's windows, so it is a function of (seed, i, file list, S) alone, whatever the
number of hosts (each owns a contiguous range of streams, `local_streams`) or loader workers
(each takes every W-th of its host's streams; ``_merge_blocks`` puts the rows back in order).

The iterator state is one cursor per stream (`_Stream.cursor`), saved with what the cursors
depend on (the file list with each file's size and modification time, a hash of the text up
to each cursor): a resumed run refuses a corpus that changed since, naming the file, unless
``data.restart_stream`` drops the cursors and starts the stream afresh at the restored step.
The full layout and state: docs/design.md §5, "Streaming LM pipeline".
"""
from __future__ import annotations

import datetime
import hashlib
import os
import threading
import time
from collections.abc import Sequence

import grain
import numpy as np
from absl import flags

from ...config import ConfigError
from ...errors import DataError, warn
from .packing import WindowPacker, document_ids, features
from .readers import iter_documents
from .tokenizer import Tokenizer

BATCH_KEYS = ("inputs", "targets", "weights", "segment_ids")


_NO_SHARED_MEMORY = 2**62  # grain's min_shm_size: blocks smaller than this are pickled


class CorpusChanged(DataError):
    """The corpus differs from the one a checkpoint's stream positions were read from."""


# What the errors about a changed corpus suggest.
_ADVICE = ("the checkpoint's stream positions belong to the corpus as it was: restore the "
           "corpus to resume exactly, or give --data.restart_stream true to resume on it as it "
           "is now, its data stream started afresh")


def _text_digest():
    return hashlib.blake2b(digest_size=16)


def deal_files(files: Sequence[str], n_streams: int) -> list[tuple[str, ...]]:
    """Stream s's files: files[s::n_streams]."""
    if len(files) < n_streams:
        raise ConfigError(f"data.streams: {n_streams} streams need at least {n_streams} corpus "
                          f"files, got {len(files)}; lower --data.streams", field="data.streams")
    return [tuple(files[s::n_streams]) for s in range(n_streams)]


def local_streams(n_streams: int, global_batch: int, process_index: int,
                  process_count: int) -> range:
    """The streams process `process_index` of `process_count` owns (its rows of every global
    batch); impossible layouts are errors naming the setting to change."""
    if global_batch % n_streams:
        raise ConfigError(f"data.streams: {n_streams} streams do not divide data.batch_size="
                          f"{global_batch}", field="data.streams")
    if n_streams % process_count:
        raise ConfigError(f"data.streams: {n_streams} streams do not split over "
                          f"{process_count} processes", field="data.streams")
    per = n_streams // process_count
    return range(process_index * per, (process_index + 1) * per)


class _Stream:
    """One stream's documents, epoch after epoch, packed into windows."""

    def __init__(self, files: tuple[str, ...], index: int, seed: int, seq_len: int,
                 tokenizer: Tokenizer, fmt: str):
        self.files, self.index, self.seed = files, index, seed
        self.tokenizer, self.fmt = tokenizer, fmt
        self.packer = WindowPacker(seq_len)
        self.epoch, self.file_pos, self.doc_line = 0, 0, 0  # doc_line 0: no document yet
        self.doc_digest = ""  # the open file's text through the current document, hashed
        self._docs = None  # the open file's (line, text) iterator
        self._digest = _text_digest()
        self._files_without_docs = 0

    def _path(self) -> str:
        rng = np.random.default_rng([self.seed, self.index, self.epoch])
        order = rng.permutation(len(self.files))
        return self.files[order[self.file_pos]]

    def _open(self, start_line: int = 1) -> None:
        self._digest = _text_digest()
        self._docs = iter_documents(self._path(), self.fmt, start_line=start_line,
                                    digest=self._digest)

    def next_document(self) -> np.ndarray:
        while True:
            if self._docs is None:
                self._open()
            item = next(self._docs, None)
            if item is not None and item[1].strip():
                self._files_without_docs = 0
                self.doc_line, self.doc_digest = item[0], self._digest.hexdigest()
                return document_ids(self.tokenizer.encode(item[1]))
            if item is not None:
                continue
            self._docs = None
            self._files_without_docs += 1
            if self._files_without_docs > len(self.files):
                raise DataError(f"stream {self.index}: no document in any of its files "
                                f"({', '.join(self.files)})")
            self.file_pos += 1
            if self.file_pos == len(self.files):
                self.epoch, self.file_pos = self.epoch + 1, 0

    def window(self) -> dict[str, np.ndarray]:
        return features(*self.packer.window(self.next_document))

    def cursor(self) -> list:
        return [self.epoch, self.file_pos, self.doc_line, self.packer.offset, self.doc_digest]

    def seek(self, cursor: Sequence) -> None:
        """Go to a saved cursor: 5 fields, or 4 (written before the text hash, unchecked)."""
        self.epoch, self.file_pos, self.doc_line, offset = (int(c) for c in cursor[:4])
        saved_digest = str(cursor[4]) if len(cursor) > 4 else ""
        self.packer = WindowPacker(self.packer.seq_len)
        self._docs, self.doc_digest = None, ""
        if self.doc_line:
            self._open(self.doc_line)
            item = next(self._docs, None)
            if item is None or item[0] != self.doc_line:
                raise CorpusChanged(f"{self._path()}:{self.doc_line}: no document starts here any "
                                    f"more; the corpus changed since the checkpoint was "
                                    f"written; {_ADVICE}")
            self.doc_digest = self._digest.hexdigest()
            if saved_digest and saved_digest != self.doc_digest:
                raise CorpusChanged(f"{self._path()}:{self.doc_line}: the file's text up to the "
                                    f"end of this document changed since the checkpoint was "
                                    f"written; {_ADVICE}")
            ids = document_ids(self.tokenizer.encode(item[1]))
            if offset > len(ids):
                raise CorpusChanged(f"{self._path()}:{self.doc_line}: the document is shorter "
                                    f"than the checkpoint says ({len(ids)} < {offset} tokens); "
                                    f"the corpus or tokenizer changed since the checkpoint was "
                                    f"written; {_ADVICE}")
            self.packer.doc, self.packer.offset = ids, offset


class PackedStreams(grain.IterDataset):
    """Source of one block per global batch: this loader's streams' R windows each,
    [n_streams_here, R, T] per feature.

    Supports grain's in-place slicing: ``mp_prefetch`` gives worker w of W ``streams[w::W]``,
    and each worker then hands over one block per batch (a transfer per stream would cost
    the trainer more than the tokenization it saves)."""

    def __init__(self, files_by_stream: Sequence[tuple[str, ...]], streams: Sequence[int], *,
                 seq_len: int, rows: int, seed: int, tokenizer: str, fmt: str = "auto"):
        super().__init__()
        self.files_by_stream = list(files_by_stream)
        self.streams = list(streams)
        self.seq_len, self.rows, self.seed = seq_len, rows, seed
        self.tokenizer, self.fmt = tokenizer, fmt  # a path: each worker process loads its own

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        del sequential_slice  # streams are dealt one by one either way
        self.streams = self.streams[sl]

    def __iter__(self) -> "_PackedStreamsIterator":
        return _PackedStreamsIterator(self)

    def __str__(self) -> str:
        return f"PackedStreams(streams={self.streams}, seq_len={self.seq_len}, rows={self.rows})"


class _PackedStreamsIterator(grain.DatasetIterator):
    def __init__(self, ds: PackedStreams):
        super().__init__()
        tok = Tokenizer.load(ds.tokenizer)
        self.rows = ds.rows
        self.streams = [_Stream(ds.files_by_stream[s], s, ds.seed, ds.seq_len, tok, ds.fmt)
                        for s in ds.streams]

    def __next__(self) -> dict[str, np.ndarray]:
        windows = [[s.window() for _ in range(self.rows)] for s in self.streams]
        return {k: np.stack([np.stack([w[k] for w in ws]) for ws in windows])
                for k in BATCH_KEYS}

    def get_state(self) -> dict:
        return {"cursors": {str(s.index): s.cursor() for s in self.streams}}

    def set_state(self, state: dict) -> None:
        mine = sorted(str(s.index) for s in self.streams)
        if sorted(state.get("cursors", {})) != mine:
            raise DataError(f"the data-iterator state holds streams "
                            f"{sorted(state.get('cursors', {}))}, this loader reads streams "
                            f"{mine}: data.streams, data.workers or the process count changed "
                            f"since the checkpoint was written")
        for s in self.streams:
            s.seek(state["cursors"][str(s.index)])


def _exit_with_parent(worker_index: int, worker_count: int) -> None:
    """Runs in each loader worker: exit when the trainer that started it is gone. A trainer
    killed with SIGKILL never tells grain's workers to stop, and they would wait forever on a
    full buffer, holding memory and the trainer's output pipes."""
    del worker_index, worker_count
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-trainer").start()


def corpus_record(files: Sequence[str]) -> list[list]:
    """[path, size, modification time in ns] of every file, in order: what the stream
    positions of a checkpoint depend on, besides the text up to each cursor."""
    stats = [os.stat(f) for f in files]
    return [[str(f), st.st_size, st.st_mtime_ns] for f, st in zip(files, stats)]


def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="seconds")


def first_change(changes: Sequence[str]) -> str:
    """The first of `changes`, with how many more there are; "" when there is none."""
    if len(changes) > 1:
        return f"{changes[0]} (and {len(changes) - 1} more change{'s' if len(changes) > 2 else ''})"
    return changes[0] if changes else ""


def corpus_change(saved: Sequence, now: Sequence) -> str:
    """One line naming a file that differs between two corpus_record()s and what changed
    (with how many other changes there are); "" if none does."""
    old = {f: (size, mtime) for f, size, mtime in saved}
    new = {f: (size, mtime) for f, size, mtime in now}
    changes = [f"{f}: in data.corpus when the checkpoint was written, gone now"
               for f in old if f not in new]
    changes += [f"{f}: added to data.corpus since the checkpoint was written (the files would "
                f"be dealt to the streams anew)" for f in new if f not in old]
    for f in new:
        if f in old and old[f] != new[f]:
            (size0, t0), (size1, t1) = old[f], new[f]
            what = (f"size {size0} -> {size1} bytes" if size0 != size1 else
                    f"modified {_when(t1)}, the checkpoint read it as of {_when(t0)}; same size")
            changes.append(f"{f}: changed since the checkpoint was written ({what})")
    moved = [f for (f, *_), (g, *_) in zip(now, saved) if f != g]
    if not changes and moved:
        changes.append(f"{moved[0]}: data.corpus lists its files in another order than when the "
                       f"checkpoint was written")
    return first_change(changes)


class _CorpusChecked(grain.IterDataset):
    """The loader, with what its state depends on (the corpus record, the batches read) added
    to its checkpointed state and checked when that is restored; restart: drop the saved
    positions instead (data.restart_stream). Also closes the loader (worker processes, shared
    memory) when reading fails, so that the error is the last thing the run prints."""

    def __init__(self, parent: grain.IterDataset, files: Sequence[str], restart: bool,
                 announce: bool):
        super().__init__(parent)
        self.record = corpus_record(files)
        self.restart, self.announce = restart, announce

    def __iter__(self) -> "_CorpusCheckedIterator":
        return _CorpusCheckedIterator(self)

    def __str__(self) -> str:
        return f"CorpusChecked(files={len(self.record)}, restart={self.restart})"


class _CorpusCheckedIterator(grain.DatasetIterator):
    def __init__(self, ds: _CorpusChecked):
        super().__init__(ds._parent.__iter__())
        self.record, self.restart, self.announce = ds.record, ds.restart, ds.announce
        self.batches = 0  # None: unknown (restored from a state that did not count them)

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            batch = next(self._parent)
        except BaseException:
            self.close()  # stop the workers and free their buffers before the error is shown
            raise
        if self.batches is not None:
            self.batches += 1
        return batch

    def get_state(self) -> dict:
        return {"corpus": self.record, "batches": self.batches, "loader": self._parent.get_state()}

    def set_state(self, state: dict) -> None:
        if "loader" not in state:  # written before the corpus record: nothing to check
            self.batches = None
            if self.restart:
                self._restarted("the checkpoint's step", "")
            else:
                self._parent.set_state(state)
            return
        change = corpus_change(state["corpus"], self.record)
        self.batches = state["batches"]
        if self.restart:
            self._restarted("the checkpoint's step" if self.batches is None
                            else f"step {self.batches}", change)
            return
        if change:
            raise CorpusChanged(f"{change}; {_ADVICE}")
        self._parent.set_state(state["loader"])

    def _restarted(self, step: str, change: str) -> None:
        if self.announce:
            now = f"the corpus changed: {change}" if change else "the corpus is unchanged"
            warn(f"data.restart_stream: the data stream starts afresh at {step}, on the "
                 f"{len(self.record)} files of data.corpus as a fresh run reads them ({now}); "
                 f"drop --data.restart_stream when resuming again, or each resume restarts it")


def _merge_blocks(blocks: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One batch from each worker's block: worker w holds local streams w, w+W, ..., so
    local stream s is row s // W of block s % W; rows come out stream after stream."""
    W = len(blocks)
    out = {}
    for k in BATCH_KEYS:
        n = sum(b[k].shape[0] for b in blocks)
        per_stream = [blocks[s % W][k][s // W] for s in range(n)]  # each [R, T]
        out[k] = np.concatenate(per_stream)
    return out


def streaming_dataset(files: Sequence[str], *, seq_len: int, global_batch: int, n_streams: int,
                      seed: int, tokenizer: str, workers: int = 0, process_index: int = 0,
                      process_count: int = 1, fmt: str = "auto",
                      restart: bool = False) -> grain.IterDataset:
    """This process's rows of every global batch, [global_batch / process_count, seq_len] per
    feature (BATCH_KEYS), read and tokenized by `workers` loader processes (0: a thread of
    this one). Its state is checked against the corpus when restored; `restart`
    (data.restart_stream): the restored state's stream positions are dropped instead."""
    # grain reads absl flags in its worker plumbing; a program that never parsed them (ours
    # take their own command line) would fail there.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    if workers < 0:
        raise ConfigError(f"data.workers: must be >= 0, got {workers}", field="data.workers")
    mine = local_streams(n_streams, global_batch, process_index, process_count)
    if workers > len(mine) or (workers and len(mine) % workers):
        raise ConfigError(f"data.workers: {workers} loader workers do not split this process's "
                          f"{len(mine)} streams evenly (data.streams={n_streams} over "
                          f"{process_count} processes)", field="data.workers")
    ds: grain.IterDataset = PackedStreams(deal_files(files, n_streams), mine, seq_len=seq_len,
                                          rows=global_batch // n_streams, seed=seed,
                                          tokenizer=tokenizer, fmt=fmt)
    if workers:
        # Blocks travel through the workers' queues, not shared memory: a worker stopped by
        # an error (or by the trainer's) would leave its shared-memory blocks behind.
        ds = grain.experimental.WithOptionsIterDataset(
            ds, grain.experimental.DatasetOptions(min_shm_size=_NO_SHARED_MEMORY))
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                         per_worker_buffer_size=2),
                            worker_init_fn=_exit_with_parent)
    else:
        ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=2)
    ds = ds.batch(max(workers, 1), batch_fn=_merge_blocks)
    return _CorpusChecked(ds, files, restart, announce=process_index == 0)
