"""The processes of a multi-process run: how they join (``start``: jax.distributed, the ids
found by jax itself under SLURM, Cloud TPU, Open MPI or Kubernetes, or given by hand) and
what they must share (``check_shared_dir``: one run directory, seen by every process)."""
from __future__ import annotations

import secrets
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..config import ConfigError
from ..config.mesh import AUTO, MeshConfig


def start(mesh: MeshConfig) -> None:
    """Join this process to the run's others, once, before any computation: with
    ``num_processes`` AUTO, jax.distributed.initialize() with no arguments (the scheduler's
    environment names the coordinator, the processes and this one's id, and on GPUs the local
    devices it owns); with a number above 1, the coordinator and id the config gives."""
    if mesh.num_processes == 1 or jax.distributed.is_initialized():
        return
    # CPU devices of several processes reach each other through gloo (the default has none)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if mesh.num_processes == AUTO:
        try:
            jax.distributed.initialize()
        except ValueError as e:  # no scheduler found: jax asks for the coordinator
            raise ConfigError(f"mesh.num_processes: auto found no cluster environment (SLURM, "
                              f"Cloud TPU, Open MPI, Kubernetes) to join ({e}); give "
                              f"mesh.coordinator, mesh.num_processes and mesh.process_id",
                              field="mesh.num_processes") from None
    else:
        jax.distributed.initialize(coordinator_address=mesh.coordinator,
                                   num_processes=mesh.num_processes,
                                   process_id=mesh.process_id)


def barrier(name: str) -> None:
    """Wait until every process of the run is here (nothing to wait for in a single one)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def one_device_each():
    """The first device of every process: a mesh to hold what each process needs whole (an
    exported trial), one device in a single-process run."""
    first = {}
    for d in jax.devices():
        first.setdefault(d.process_index, d)
    return [first[p] for p in sorted(first)]


MARK = ".jaxdepth-processes"  # written by process 0, read by every process, then removed


def check_shared_dir(run_dir: Path) -> None:
    """Refuse, in every process at once, a multi-process run whose processes do not all see
    process 0's run directory: its tokenizer, prepared data, checkpoint shards and lock live
    there once for all of them (a per-host disk would give each host a part of a checkpoint).
    Process 0 writes a random token into it; every process reads it back."""
    if jax.process_count() == 1:
        return
    mark = Path(run_dir) / MARK
    token = np.frombuffer(secrets.token_bytes(16), np.uint8)
    if jax.process_index() == 0:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_bytes(token.tobytes())
    token = np.asarray(multihost_utils.broadcast_one_to_all(token))  # process 0's
    try:
        seen = mark.read_bytes() == token.tobytes()
    except OSError:
        seen = False
    seen_by = np.asarray(multihost_utils.process_allgather(np.int32(seen))).reshape(-1)
    if jax.process_index() == 0:
        mark.unlink()
    blind = [int(p) for p in np.flatnonzero(seen_by == 0)]
    if blind:
        which = (f"processes {', '.join(map(str, blind))} of {jax.process_count()} do"
                 if len(blind) > 1 else f"process {blind[0]} of {jax.process_count()} does")
        raise ConfigError(f"run.dir: {which} not see "
                          f"process 0's {run_dir}; every process of a run must see one run "
                          f"directory (shared storage: NFS, Lustre, a bucket mount; "
                          f"docs/cluster.md)", field="run.dir")
