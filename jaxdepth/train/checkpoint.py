"""Orbax CheckpointManager: one step = train state + data-iterator state + resolved config.

Saves are asynchronous and atomic (Orbax writes to a temporary directory and renames on
commit), so a run killed at any moment leaves the previous checkpoints intact.
"""
from __future__ import annotations

import json
from pathlib import Path

import grain
import jax
import orbax.checkpoint as ocp

from ..config import Config, ConfigError

# Fields that may differ between the run that saved a checkpoint and the one resuming it.
_RESUMABLE_CHANGES = {"run.steps", "run.stop_after", "run.progress", "run.log_every",
                      "run.eval_every", "run.eval_batches", "run.samples", "run.sample_tokens",
                      "run.save_every", "run.keep", "run.dir", "mesh.data", "mesh.model",
                      "mesh.fsdp", "mesh.coordinator", "mesh.num_processes", "mesh.process_id",
                      "model.remat", "model.scan_layers", "model.scan_unroll", "model.xent_chunk",
                      "task.eval_splits", "task.eval_max", "task.eval_batch"}


def open_manager(run_dir: Path, keep: int | None = None,
                 read_only: bool = False) -> ocp.CheckpointManager:
    """keep: checkpoints retained when saving. read_only: for readers (eval), which must
    never create, delete or garbage-collect anything in the run."""
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           create=not read_only, read_only=read_only)
    return ocp.CheckpointManager(run_dir.absolute() / "checkpoints", options=options)


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter, cfg: Config) -> None:
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iter),
        config=ocp.args.JsonSave(cfg.to_dict())), force=True)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_compatible(saved: dict, cfg: Config, where: Path) -> None:
    """Refuse to resume with a config that would change the model, data or optimizer."""
    now, before = _flat(cfg.to_dict()), _flat(saved)
    diff = [k for k in sorted(set(now) | set(before))
            if k not in _RESUMABLE_CHANGES and now.get(k) != before.get(k) and k != "preset"]
    if diff:
        details = ", ".join(f"{k}: checkpoint {before.get(k)!r} vs now {now.get(k)!r}" for k in diff)
        raise ConfigError(f"{diff[0]}: cannot resume {where} with a different config ({details})")


def saved_config(mngr: ocp.CheckpointManager, step: int) -> dict:
    return mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state, shardings, data_iter=None):
    """Restore the state (placed with the given shardings) and, if given, the data iterator
    in place."""
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)
    items = {"state": ocp.args.StandardRestore(target)}
    if data_iter is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    return mngr.restore(step, args=ocp.args.Composite(**items)).state


def write_config(run_dir: Path, cfg: Config) -> None:
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
