"""Orbax CheckpointManager: one step = train state + data-iterator state + resolved config.

Saves are asynchronous and atomic (Orbax writes to a temporary directory and renames on
commit), so a run killed at any moment leaves the previous checkpoints intact.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grain
import jax
import orbax.checkpoint as ocp

from ..config import Config, ConfigError, MeshConfig
from .optim import make_optimizer
from .sharding import make_mesh
from .step import state_shardings

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
    # A field the saved config lacks was added to the library after the checkpoint was
    # written: it had its default then.
    now, before = _flat(cfg.to_dict()), {**_flat(Config().to_dict()), **_flat(saved)}
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


def load_model(run_dir, task_for, step: int | None = None, mesh=None, mesh_cfg=None,
               label: str = "step"):
    """(model, saved Config, step) of a run's checkpoint (latest by default), opened read-only.

    task_for(saved config) gives the Task that builds the model. The state is restored on
    `mesh` (default: one device) in the layout `mesh_cfg` describes (default: data parallel),
    and only its model is returned. `label` names the setting that chose the step in error
    messages (e.g. "task.init_step").
    """
    run = Path(run_dir)
    if not (run / "checkpoints").is_dir():
        raise FileNotFoundError(f"no checkpoints in {run} (expected {run / 'checkpoints'})")
    mngr = open_manager(run, read_only=True)
    try:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {run / 'checkpoints'}")
        step = steps[-1] if step is None else step
        if step not in steps:
            raise ValueError(f"{label} {step}: not a checkpoint in {run / 'checkpoints'} "
                             f"(available: {steps})")
        cfg = Config.from_dict(saved_config(mngr, step))
        mesh = mesh if mesh is not None else make_mesh(MeshConfig(data=1))
        placed = dataclasses.replace(cfg, mesh=mesh_cfg or MeshConfig(data=mesh.shape["data"],
                                                                     model=mesh.shape["model"]))
        tx = make_optimizer(cfg.optim, cfg.run.steps)
        state = restore(mngr, step, *state_shardings(placed, tx, mesh, task_for(placed)))
    finally:
        mngr.close()
    return state.model, cfg, step
