"""A frozen backbone's states, computed once per sentence (fusion.mode=fe, docs/design.md §4).

In feature extraction the backbone runs without dropout and never trains, so what it gives
the fusion module for a sentence (``FusedModel.frozen_states``) is the same at every step
and every evaluation. The NER task computes it once, when the model is ready, and trains and
evaluates the fusion module and head on it. A split's cache is held in memory, or written to a
memory-mapped ``.npy`` file under ``<run>/cache/`` when all splits together exceed
``fusion.cache_mib``.
"""
from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import numpy as np

INPUTS = ("tokens", "segments", "mask", "positions")


class StateCache:
    """A split's cached states, indexed by sentence like its other arrays (so
    ``ExampleBatchSource`` batches it with them); empty until ``fill``."""

    def __init__(self, n: int):
        self.n = n
        self.array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows):
        if self.array is None:
            raise RuntimeError("a state cache was read before the model was ready "
                               "(Task.model_ready fills it before the first batch)")
        return self.array[rows]


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


def fill(cache: StateCache, model, arrays: dict, batch: int, spec: jax.ShapeDtypeStruct,
         path: Path | None) -> None:
    """Compute the states of every sentence of `arrays`, `batch` at a time (the last batch
    padded, so one compilation serves all), into memory or the .npy file at `path`."""
    shape = (cache.n, *spec.shape)
    if path is None:
        out = np.empty(shape, spec.dtype)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=spec.dtype, shape=shape)
    for i in range(0, cache.n, batch):
        real = min(batch, cache.n - i)
        part = pad_rows({k: arrays[k][i:i + batch] for k in INPUTS}, batch)
        out[i:i + real] = np.asarray(_frozen_states(model, *(part[k] for k in INPUTS)))[:real]
    if path is not None:
        out.flush()
    cache.array = out
