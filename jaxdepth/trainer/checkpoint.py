"""What a checkpoint is, and its save (restore.py reads it back; docs/design.md §6). An Orbax
CheckpointManager, asynchronous and atomic (a run killed at any moment leaves the previous
checkpoints intact): one step = train state (in its saved layout) + data-iterator state +
resolved config + their fingerprints, a SHA-256 of each process's data-iterator state file
and of the config, and one per array of the state, ``sum_i bits_i * (2 i + 1) mod 2**32``
over its elements' bit patterns, computed on the devices. TensorStore's zstd frames carry no
checksum, so a flipped bit could restore as another, often finite, number; with an odd
multiplier any single changed bit, or a value moved, changes it, however the array is sharded.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jaxtyping import Array

from ..config import Config
from ..errors import UserError, describe, os_error_reason
from .sharding import unstacked
from .state import TrainState


# ----------------------------------------------------------------------------- fingerprints

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _bits(x: jax.Array) -> jax.Array:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32).ravel()
    return jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32).ravel()


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    out = []
    for x in leaves:
        bits = _bits(x)
        weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
        out.append(jnp.sum(bits * weights, dtype=jnp.uint32))
    return out


def fingerprints(tree) -> dict[str, int]:
    """Dotted path of every array leaf of `tree` -> its fingerprint (one device sync)."""
    arrays = [(jax.tree_util.keystr(path), leaf)
              for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
              if isinstance(leaf, jax.Array)]
    # Each value is replicated; a process reads its own copy (on several hosts the global
    # array is not addressable as a whole).
    return {p: int(np.asarray(v.addressable_data(0)))
            for (p, _), v in zip(arrays, _fingerprints([x for _, x in arrays]))}


def mismatches(tree, saved: dict[str, int]) -> list[str]:
    """Paths of the array leaves of `tree` whose fingerprint differs from the saved one
    (leaves the saved record lacks are not checked)."""
    return [p for p, v in fingerprints(tree).items() if p in saved and saved[p] != v]


# ----------------------------------------------------------------------------- the manager


class CheckpointSaveFailed(UserError):
    """An asynchronous save failed on the disk; nothing of it was committed."""


# Keys of the non-array entries of the fingerprints item (array keys are jax key paths, which
# start with "." or "[").
CONFIG_KEY = "config"


# How a checkpoint holds the state: the one place besides the step (state.make_step) where a
# run of one trial is told apart. A run of one is saved without its trial axis, as every
# checkpoint written before trials existed holds it (and resumes with it); K > 1 trials as
# they have been saved since trials existed. Orbax keys a checkpoint by these attribute
# names, not by the classes.


class OneTrial(eqx.Module):
    """A checkpoint of a run of one trial: its state without the trial axis."""

    step: Array
    model: Any
    opt_state: Any
    key: Array


class Stacked(eqx.Module):
    """A checkpoint of K > 1 trials: their state on the trial axis (the shared arrays
    apart)."""

    state: OneTrial
    hparams: dict
    frozen: Array
    shared: Any = None


def _squeeze(leaf):
    """One leaf of a run of one without its trial axis: an array, its abstract shape or its
    sharding."""
    if isinstance(leaf, NamedSharding):
        return unstacked(leaf)
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    return leaf[0]


def _layout(t: TrainState, k: int):
    """What a checkpoint holds of a state of k trials: `t` may hold its arrays, their
    abstract shapes or their shardings."""
    own = OneTrial(t.step, t.model, t.opt_state, t.key)
    if k > 1:
        return Stacked(own, t.hparams, t.frozen, t.shared)
    one = jax.tree.map(_squeeze, own)
    if t.shared is not None:
        one = OneTrial(one.step, eqx.combine(one.model, t.shared), one.opt_state, one.key)
    return one


def layouts(abstract: TrainState, shardings: TrainState):
    """(abstract shapes, shardings) of the saved layout of a state shaped like `abstract`."""
    k = abstract.frozen.shape[0]
    return _layout(abstract, k), _layout(shardings, k)


def data_key(process_index: int, process_count: int) -> str:
    """The fingerprints key of a process's data-iterator state: grain's file name for it."""
    return f"data/process_{process_index}-of-{process_count}.json"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_digest(config: dict) -> str:
    """Of the config as JSON reads it back (canonical: sorted keys)."""
    return sha256_hex(json.dumps(json.loads(json.dumps(config)), sort_keys=True).encode())


class _SavedText:
    """What grain's CheckpointSave writes for the trials' data-iterator states, computed once,
    so its digest is the digest of the file: grain writes ``get_state().decode()`` of anything
    but its own iterators, and ``json.dumps(state, indent=4)`` of their states. A run of one
    holds the state of its iterator (a loader's JSON bytes as they are), K > 1
    {"trials": [each state]}."""

    def __init__(self, states: list):
        if len(states) == 1:
            s = states[0]
            self.text = json.dumps(s, indent=4) if isinstance(s, dict) else s.decode()
        else:
            self.text = json.dumps({"trials": [json.loads(s) if isinstance(s, bytes) else s
                                               for s in states]}, indent=4)

    def get_state(self) -> bytes:
        return self.text.encode()


def _data_digests(text: str) -> dict[str, str]:
    """data_key -> digest of every process's data-iterator state file (each process digests
    its own; with several processes they are gathered, since process 0 writes the record)."""
    digest = sha256_hex(text.encode())
    n = jax.process_count()
    if n == 1:
        return {data_key(0, 1): digest}
    every = np.asarray(multihost_utils.process_allgather(
        np.frombuffer(bytes.fromhex(digest), np.uint8)))
    return {data_key(i, n): bytes(every[i].astype(np.uint8)).hex() for i in range(n)}


def open_manager(run_dir: Path, keep: int | None = None,
                 read_only: bool = False) -> ocp.CheckpointManager:
    """keep: checkpoints retained when saving. read_only: for readers (eval), which must
    never create, delete or garbage-collect anything in the run."""
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           create=not read_only, read_only=read_only)
    return ocp.CheckpointManager(run_dir.absolute() / "checkpoints", options=options)


def save(mngr: ocp.CheckpointManager, step: int, state: TrainState, data_states: list,
         cfg: Config) -> None:
    """Save `state` (in its saved layout) and each trial's data-iterator state (Batches.states)
    as checkpoint `step`, asynchronously."""
    data = _SavedText(data_states)
    config = cfg.to_dict()
    saved = _layout(state, state.n_trials)
    record = {**fingerprints(saved), **_data_digests(data.text), CONFIG_KEY: config_digest(config)}
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(saved),
        data=grain.checkpoint.CheckpointSave(data),
        config=ocp.args.JsonSave(config),
        fingerprints=ocp.args.JsonSave(record)), force=True)


def check_saves(mngr: ocp.CheckpointManager, saving: int, at_step: int, where: Path,
                wait: bool = False) -> bool:
    """Whether the asynchronous save of step `saving` is over (wait: wait until it is);
    CheckpointSaveFailed if it failed. The failed save never committed, so the previous
    checkpoint is intact. where: the checkpoint directory as messages name it."""
    try:
        # Orbax keeps the error of a failed save in its finalize thread, where
        # check_for_errors() does not look: it is raised when that thread is joined.
        if wait or not mngr.is_saving_in_progress():
            mngr.wait_until_finished()  # at once when the save is over
            return True
        mngr.check_for_errors()
        return False
    except Exception as e:
        reason = os_error_reason(e)
        if reason is None and not isinstance(e, OSError):
            raise  # not the disk: a bug
        kept = [s for s in mngr.all_steps() if s != saving]
        then = (f"the checkpoint of step {max(kept)} is intact: fix the disk (space, permissions) "
                f"and rerun the same command to resume from it" if kept
                else "there is no earlier checkpoint")
        raise CheckpointSaveFailed(
            f"{reason or describe(e)} while saving step {saving} to "
            f"{where / str(saving)}; training stopped at step {at_step}; "
            f"{then}"
        ) from e
