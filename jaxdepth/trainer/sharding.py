"""Mesh construction and a logical-axis rule table (t5x style).

Parameters name their axes logically (embed, mlp, heads, vocab, layers), declared by the model
module that creates each one (models/declared.py; the trainer asks ``model.logical_axes()``
and names no parameter); RULES maps those names to mesh axes. Data parallel = batch over
"data"; FSDP = embed over "data" as well; tensor parallel = heads / mlp / vocab over "model".
A dimension that the mesh axis does not divide is replicated instead (e.g. Eq. 1's odd d_ff
values), with a warning naming it.
"""
from __future__ import annotations

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..config import ConfigError, MeshConfig
from ..errors import warn

RULES = {
    "batch": "data",
    "embed": "fsdp",  # "data" when mesh.fsdp, else replicated
    "mlp": "model",
    "heads": "model",
    "vocab": "model",
    "layers": None,
    "buckets": None,
    "norm": None,
}

_warned: set[str] = set()  # warnings already given by this process


def _warn_once(message: str) -> None:
    if message not in _warned and jax.process_index() == 0:
        _warned.add(message)
        warn(message)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    data = cfg.data if cfg.data > 0 else len(devices) // cfg.model
    n = data * cfg.model
    if data < 1 or n > len(devices):
        raise ConfigError(f"mesh.data x mesh.model = {data} x {cfg.model} needs {n} devices, "
                          f"{len(devices)} available")
    if cfg.data == -1 and n < len(devices):
        _warn_once(f"mesh.data=-1 uses {n} of the {len(devices)} devices ({data} x mesh.model="
                   f"{cfg.model}); {len(devices) - n} stay idle")
    return Mesh(np.asarray(devices[:n]).reshape(data, cfg.model), ("data", "model"))


def logical_to_spec(axes, shape, mesh: Mesh, fsdp: bool, undivided: list) -> P:
    """The partition spec of an array with these logical axes; each dimension its mesh axis
    does not divide is replicated and appended to `undivided` as (dimension index, size, mesh
    axis)."""
    out = []
    for i, (name, dim) in enumerate(zip(axes, shape)):
        mesh_axis = RULES[name]
        if mesh_axis == "fsdp":
            mesh_axis = "data" if fsdp else None
        if mesh_axis is not None and dim % mesh.shape[mesh_axis]:
            undivided.append((i, dim, mesh_axis))
            mesh_axis = None
        elif mesh_axis in out:
            mesh_axis = None
        out.append(mesh_axis)
    return P(*out)


def param_shardings(params, mesh: Mesh, fsdp: bool):
    """NamedSharding for every array leaf of a model (pytree with the same structure). The
    dimensions left replicated because the mesh does not divide them are named in a warning
    (once per process): they lose tensor parallelism (or FSDP) without failing."""
    replicated_dims = []

    def one(path, leaf, axes):
        undivided = []
        spec = logical_to_spec(axes, leaf.shape, mesh, fsdp, undivided)
        name = ".".join(k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey))
        replicated_dims.extend(f"{name} dim {i} ({dim} over {mesh_axis}={mesh.shape[mesh_axis]})"
                               for i, dim, mesh_axis in undivided)
        return NamedSharding(mesh, spec)

    # Each parameter's axes are declared by the model module that creates it
    # (models/declared.py); an axes tuple is a subtree where params has a leaf.
    out = jax.tree_util.tree_map_with_path(one, params, params.logical_axes())
    if replicated_dims:
        _warn_once(f"replicated, since the mesh axis does not divide them: "
                   f"{', '.join(replicated_dims)}")
    return out


def opt_state_shardings(tx: optax.GradientTransformation, abstract_opt_state, abstract_params,
                        p_shardings, mesh: Mesh):
    """Optimizer moments shaped like their parameter follow its sharding; the rest replicate."""
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        tx, lambda leaf, param, sh: sh if leaf.shape == param.shape else replicated,
        abstract_opt_state, abstract_params, p_shardings,
        transform_non_params=lambda _: replicated)


def trial_mesh_axis(mesh: Mesh, k: int) -> str | None:
    """The mesh axis the trial axis is sharded over: "data" when the K trials divide over
    more than one device of it (the model axis then stays within each trial) and the mesh
    lies in one process, else None: each trial's rows are then split over the data axis.
    Across processes, every process reads its share of every trial's rows (the loaders split
    rows, not trials), so there the trials are laid out as one data-parallel run each."""
    n = mesh.shape["data"]
    one_process = len({d.process_index for d in mesh.devices.flat}) == 1
    return "data" if n > 1 and k % n == 0 and one_process else None


def stacked(sharding: NamedSharding, axis: str | None) -> NamedSharding:
    """A trial's leaf sharding with a leading trial axis; a trial axis over "data" takes that
    axis from the leaf (an FSDP-sharded parameter is then whole within its trial)."""
    inner = tuple(None if (a == axis or (isinstance(a, tuple) and axis in a)) else a
                  for a in sharding.spec) if axis else tuple(sharding.spec)
    return NamedSharding(sharding.mesh, P(axis, *inner))


def unstacked(sharding: NamedSharding) -> NamedSharding:
    """A leaf sharding of a run of one without its trial axis (which is on no mesh axis)."""
    return NamedSharding(sharding.mesh, P(*sharding.spec[1:]))


def batch_sharding(mesh: Mesh, k: int | None = None) -> NamedSharding:
    """Batches over the data axis: an evaluation's [B, ...] rows (k None), or the K trials'
    training batches [K, B, ...], over the trials or each trial's rows over the data axis."""
    if k is None:
        return NamedSharding(mesh, P("data"))
    axis = trial_mesh_axis(mesh, k)
    return NamedSharding(mesh, P(axis) if axis else P(None, "data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def to_global(batch: dict, sharding) -> dict:
    """Process-local rows -> global arrays sharded over the data axis."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}


def local_rows(batch: dict) -> dict:
    """This process's share of the rows of a batch every process holds whole."""
    p, n = jax.process_index(), jax.process_count()
    rows = next(iter(batch.values())).shape[0] // n
    return {k: v[p * rows:(p + 1) * rows] for k, v in batch.items()}
