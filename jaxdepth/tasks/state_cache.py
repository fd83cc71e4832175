"""A frozen backbone's states, computed once per sentence (fusion.mode=fe, docs/design.md §4).

In feature extraction the backbone runs without dropout and never trains, so what it gives the
fusion module for a sentence (``FusedModel.frozen_states``) never changes: the NER task computes
it once, when the model is ready, and trains and evaluates on it. Each layout stores its own
states (``shape``, ``store``); the task picks the one of the method's ``INPUT``:

- ``WordCache`` (a method that reads words): the [L, D] states of every word slot in use,
  packed sentence after sentence (a WikiAnn sentence uses 8 of its split's 126 slots on
  average). A batch carries only its sentences' words (``pack``), in the order
  ``FusedModel.__call__`` packs them with n_active, so the step computes the uncached numbers.
- ``StateCache`` (a method that reads the sentence: Base+n): z_L at every position, one [T, D]
  row per sentence.

A split's cache is held in memory, or in a memory-mapped ``.npy`` file under ``<run>/cache/``
when all splits together exceed ``fusion.cache_mib``.
"""
from __future__ import annotations

import collections
import hashlib
from pathlib import Path

import equinox as eqx
import jax
import numpy as np

from ..data.corpus.pipeline import ExampleBatchSource

INPUTS = ("tokens", "segments", "mask", "positions")


class StateCache:
    """A split's cached states, indexed by sentence like its other arrays (so
    ``ExampleBatchSource`` batches it with them); empty until ``fill``."""

    def __init__(self, n: int):
        self.n = n
        self.array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def nbytes(self, spec: jax.ShapeDtypeStruct) -> int:
        return self.n * int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize

    def __getitem__(self, rows):
        if self.array is None:
            raise RuntimeError("a state cache was read before the model was ready "
                               "(Task.model_ready fills it before the first batch)")
        return self.array[rows]

    def shape(self, spec: jax.ShapeDtypeStruct) -> tuple[int, ...]:
        """The array that holds every sentence's states (spec: one sentence's [T, D])."""
        return (self.n, *spec.shape)

    def store(self, out: np.ndarray, rows: np.ndarray, width: int, states: np.ndarray) -> None:
        """Write the states [len(rows), width, D] of `rows`, computed at `width` positions."""
        if states.shape[1] != out.shape[1]:  # zeros past the width, where the mask hides them
            out[rows] = 0
            out[rows, :width] = states
        else:
            out[rows] = states


class WordCache:
    """A split's packed word states: row r's words are words[offsets[r]:offsets[r + 1]], in
    slot order; slot[w] is word w's slot in its row. ``array`` holds the states [W, L, D];
    None until ``fill``."""

    def __init__(self, positions_NP: np.ndarray):
        used = np.asarray(positions_NP) > 0
        self.n, self.width = used.shape  # sentences, slots per sentence (P)
        self.offsets = np.concatenate([[0], np.cumsum(used.sum(1))]).astype(np.int64)
        self.slot = np.nonzero(used)[1].astype(np.int32)
        self.array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def nbytes(self, spec: jax.ShapeDtypeStruct) -> int:
        """Size of the states of the words alone (spec: one sentence's [L, P, D])."""
        return int(np.prod(self.shape(spec))) * np.dtype(spec.dtype).itemsize

    def shape(self, spec: jax.ShapeDtypeStruct) -> tuple[int, ...]:
        """The array that holds every word's states, [W, L, D]."""
        L, _, D = spec.shape
        return (int(self.offsets[-1]), L, D)

    def store(self, out: np.ndarray, rows: np.ndarray, width: int, states: np.ndarray) -> None:
        """Write the words of `rows` from their sentences' states [len(rows), L, P, D]."""
        for r, row in enumerate(rows):
            lo, hi = self.offsets[row], self.offsets[row + 1]
            out[lo:hi] = np.moveaxis(states[r][:, self.slot[lo:hi]], 1, 0)

    def pack(self, rows, *, first_row: int, accum: int, micro_rows: int,
             per_micro: int) -> tuple[np.ndarray, np.ndarray]:
        """(words [accum * per_micro, L, D], slots [accum * per_micro]) for `rows`, rows
        first_row.. of a global batch that the train step splits into `accum` micro-batches
        of `micro_rows` (global row b goes to micro-batch b % accum, as its row b // accum).
        Micro-batch m's words sit at m, m + accum, ... so the step's split hands each
        micro-batch its own, and processes' blocks concatenate into the same layout; slots
        index the micro-batch's [micro_rows, P] slots, micro_rows * P marking padding."""
        if self.array is None:
            raise RuntimeError("a state cache was read before the model was ready "
                               "(Task.model_ready fills it before the first batch)")
        P = self.width
        words = np.zeros((accum * per_micro, *self.array.shape[1:]), self.array.dtype)
        slots = np.full(accum * per_micro, micro_rows * P, np.int32)
        used = [0] * accum
        for r, row in enumerate(np.asarray(rows)):
            b = first_row + r
            m = b % accum
            lo, hi = self.offsets[row], self.offsets[row + 1]
            k = used[m]
            if k + hi - lo > per_micro:
                raise ValueError(f"a micro-batch uses more than its bound of {per_micro} word "
                                 f"slots (tasks/ner.py drawn_active_bounds)")
            dst = np.arange(k, k + hi - lo) * accum + m
            words[dst] = self.array[lo:hi]
            slots[dst] = (b // accum) * P + self.slot[lo:hi]
            used[m] = k + hi - lo
        return words, slots


class PackedBatchSource(ExampleBatchSource):
    """ExampleBatchSource whose batches also carry their sentences' packed word states
    ("words", "slots"; WordCache.pack), the same rows drawn in the same order."""

    def __init__(self, arrays: dict, cache: WordCache, *, accum: int, per_micro: int, **kw):
        super().__init__(arrays, **kw)
        self.cache, self.accum, self.per_micro = cache, accum, per_micro

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        ids = self.rows(i)
        out = {k: v[ids] for k, v in self.arrays.items()}
        out["words"], out["slots"] = self.cache.pack(
            ids, first_row=self.first_row, accum=self.accum,
            micro_rows=self.global_batch // self.accum, per_micro=self.per_micro)
        return out


def pad_rows(part: dict, batch: int) -> dict:
    """A last, short batch padded to `batch` rows with copies of its last row."""
    short = batch - len(next(iter(part.values())))
    if not short:
        return part
    return {k: np.concatenate([v, np.repeat(v[-1:], short, 0)]) for k, v in part.items()}


@eqx.filter_jit
def _frozen_states(model, tokens, segments, mask, positions):
    return model.frozen_states(tokens, segments, mask, positions)


def row_spec(model, arrays: dict) -> jax.ShapeDtypeStruct:
    """Shape and dtype of one sentence's states."""
    one = {k: arrays[k][:1] for k in INPUTS}
    out = eqx.filter_eval_shape(_frozen_states, model, *(one[k] for k in INPUTS))
    return jax.ShapeDtypeStruct(out.shape[1:], out.dtype)


def length_buckets(lengths: np.ndarray, seq_len: int, batch: int) -> list[tuple[np.ndarray, int]]:
    """Rows in order of length, `batch` at a time, each batch with the shortest power-of-two
    width >= 16 (at most seq_len) that holds its longest row: [(rows, width)]. Sentences are
    much shorter than seq_len (WikiAnn: median 11 pieces of 128), and a batch of short rows
    costs a fraction of a padded one; few widths mean few compilations."""
    order = np.argsort(lengths, kind="stable")
    out = []
    for i in range(0, len(order), batch):
        rows = order[i:i + batch]
        width = 16
        while width < lengths[rows].max():
            width *= 2
        out.append((rows, min(width, seq_len)))
    return out


_REUSED: "collections.OrderedDict[str, np.ndarray]" = collections.OrderedDict()
_REUSED_MAX = 8  # splits; an experiment's units share their dev and test sets


def backbone_digest(model) -> bytes:
    """A digest of the backbone's weights and structure (its run-time options are static
    fields of the tree) and of the kind of states the fusion method reads (its INPUT)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(str(jax.tree.structure(model.backbone)).encode())
    h.update(model.reads.__name__.encode())
    for leaf in jax.tree.leaves(eqx.filter(model.backbone, eqx.is_array)):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.view(np.uint8).data)
    return h.digest()


def states_key(backbone: bytes, arrays: dict, by_length: bool, batch: int) -> str:
    """A digest of everything a split's frozen states depend on: the backbone
    (backbone_digest), the inputs and the batching. Units of an experiment that score the
    same sentences on the same backbone (a few-shot grid: every method but Base+n, every N
    and trial) get the same key."""
    h = hashlib.blake2b(backbone, digest_size=20)
    for k in INPUTS:
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}{a.dtype}{a.shape}".encode())
        h.update(a.view(np.uint8).data)
    h.update(b"by_length" if by_length else b"full")
    h.update(f"batch{batch}".encode())  # the batches, and so the widths, it was run in
    return h.hexdigest()


def fill_or_reuse(cache: StateCache | WordCache, model, arrays: dict, batch: int,
                  spec: jax.ShapeDtypeStruct, by_length: bool, backbone: bytes,
                  path: Path | None = None) -> bool:
    """fill() into memory (or the .npy file at `path`), or take the states an earlier run
    or trial in this process computed for the same key (states_key; backbone:
    backbone_digest(model)): the frozen backbone runs once per sentence per process, and
    its states are stored once (the trials of a run share one array or one file), not once
    per run. Returns whether they were reused."""
    key = states_key(backbone, arrays, by_length, batch)
    if key in _REUSED:
        _REUSED.move_to_end(key)
        cache.array = _REUSED[key]
        return True
    if path is not None:  # fill() rewrites the file: no earlier entry may still map it
        mine = Path(path).resolve()
        for k in [k for k, a in _REUSED.items()
                  if getattr(a, "filename", None) and Path(a.filename).resolve() == mine]:
            del _REUSED[k]
    fill(cache, model, arrays, batch, spec, path, by_length)
    _REUSED[key] = cache.array
    cache.array.flags.writeable = False  # shared by later runs
    while len(_REUSED) > _REUSED_MAX:
        _REUSED.popitem(last=False)
    return False


def fill(cache: StateCache | WordCache, model, arrays: dict, batch: int,
         spec: jax.ShapeDtypeStruct, path: Path | None, by_length: bool = False) -> None:
    """Compute the states of every sentence of `arrays`, `batch` at a time (the last batch
    padded, so one compilation per width serves all), into memory or the .npy file at
    `path`. by_length: batches of similar lengths, each cut to its width (length_buckets);
    padding is masked, so a row's states are those at full width up to float rounding
    (1e-5; tests/tasks/test_state_cache.py), not bit for bit: the training split, which the
    uncached path feeds the backbone at full width, is filled at full width."""
    shape = cache.shape(spec)
    if path is None:
        out = np.empty(shape, spec.dtype)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=spec.dtype, shape=shape)
    seq_len = arrays["tokens"].shape[1]
    if by_length:
        groups = length_buckets(np.asarray(arrays["mask"]).sum(1), seq_len, batch)
    else:
        groups = [(np.arange(i, min(i + batch, cache.n)), seq_len)
                  for i in range(0, cache.n, batch)]
    for rows, width in groups:
        part = {k: arrays[k][rows] for k in INPUTS}
        part = pad_rows({k: (v if k == "positions" else v[:, :width]) for k, v in part.items()},
                        batch)
        states = np.asarray(_frozen_states(model, *(part[k] for k in INPUTS)))[:len(rows)]
        cache.store(out, rows, width, states)
    if path is not None:
        out.flush()
    cache.array = out
