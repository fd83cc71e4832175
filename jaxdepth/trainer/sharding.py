"""Mesh construction and a logical-axis rule table (t5x style).

Parameters name their axes logically (embed, mlp, heads, vocab, layers); RULES maps those
names to mesh axes. Data parallel = batch over "data"; FSDP = embed over "data" as well;
tensor parallel = heads / mlp / vocab over "model". A dimension that the mesh axis does not
divide is replicated instead (e.g. Eq. 1's odd d_ff values), with a warning naming it.
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

# Logical axes of each decoder parameter, keyed by the end of its attribute path.
PARAM_AXES = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    **{f"attn.{w}": ("embed", "heads") for w in ("wq", "wk", "wv")},
    "attn.wo": ("heads", "embed"),
    "mlp.wi_0": ("embed", "mlp"),
    "mlp.wi_1": ("embed", "mlp"),
    "mlp.wo": ("mlp", "embed"),
    "scale": ("norm",),
    "rel_bias.table": ("buckets", "heads"),
    # encoders (models/act.py): BERT-style dense layers with biases, ALBERT embeddings
    **{f"attn.{w}.w": ("embed", "heads") for w in ("q", "k", "v")},
    "attn.o.w": ("heads", "embed"),
    "ff_in.w": ("embed", "mlp"),
    "ff_in.b": ("mlp",),
    "ff_out.w": ("mlp", "embed"),
    "token_VE": ("vocab", "norm"),
    "mlm.bias_V": ("vocab",),
    "halt_b": (),
    "bias": ("norm",),
    "b": ("norm",),
    "w": ("norm", "norm"),  # small projections (embedding, pooler, heads): replicated
    "position_LE": ("norm", "norm"),
    "segment_SE": ("norm", "norm"),
    "halt_w_D": ("norm",),
    # BERT/RoBERTa encoder (models/encoder.py), its MLM head, the fusion modules
    "word_VD": ("vocab", "norm"),
    "position_PD": ("norm", "norm"),
    "token_type_YD": ("norm", "norm"),
    "bias_V": ("vocab",),
    "k_pos.value": ("norm", "norm"),  # DWAtt's frozen layer keys
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


def logical_to_spec(axes, shape, mesh: Mesh, fsdp: bool, undivided: list | None = None) -> P:
    """The partition spec of an array with these logical axes; each dimension its mesh axis
    does not divide is replicated and, if `undivided` is given, appended to it as
    (dimension index, size, mesh axis)."""
    out = []
    for i, (name, dim) in enumerate(zip(axes, shape)):
        mesh_axis = RULES[name]
        if mesh_axis == "fsdp":
            mesh_axis = "data" if fsdp else None
        if mesh_axis is not None and dim % mesh.shape[mesh_axis]:
            if undivided is not None:
                undivided.append((i, dim, mesh_axis))
            mesh_axis = None
        elif mesh_axis in out:
            mesh_axis = None
        out.append(mesh_axis)
    return P(*out)


def _param_axes(path, leaf) -> tuple:
    names = [k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)]
    dotted = ".".join(names)
    for suffix, axes in PARAM_AXES.items():
        if dotted == suffix or dotted.endswith("." + suffix):
            extra = leaf.ndim - len(axes)
            if extra not in (0, 1):
                break
            return ("layers",) * extra + axes  # stacked layers carry a leading layer axis
    raise KeyError(f"no logical axes for parameter {dotted!r} with shape {leaf.shape}")


def param_shardings(params, mesh: Mesh, fsdp: bool):
    """NamedSharding for every array leaf of a model (pytree with the same structure). The
    dimensions left replicated because the mesh does not divide them are named in a warning
    (once per process): they lose tensor parallelism (or FSDP) without failing."""
    replicated_dims = []

    def one(path, leaf):
        undivided = []
        spec = logical_to_spec(_param_axes(path, leaf), leaf.shape, mesh, fsdp, undivided)
        name = ".".join(k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey))
        replicated_dims.extend(f"{name} dim {i} ({dim} over {mesh_axis}={mesh.shape[mesh_axis]})"
                               for i, dim, mesh_axis in undivided)
        return NamedSharding(mesh, spec)

    out = jax.tree_util.tree_map_with_path(one, params)
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


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


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
