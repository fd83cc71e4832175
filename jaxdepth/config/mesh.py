"""The mesh section: how a run lays its arrays over devices and processes. Every field may
change when a run resumes (the same computation, laid out differently)."""
from __future__ import annotations

from dataclasses import dataclass

from ..fields import positive, require, resumable

AUTO = 0  # num_processes "auto": jax.distributed finds the processes (trainer/processes.py)


@dataclass(frozen=True)
class MeshConfig:
    data: int = resumable(-1)  # -1: every device not used by the model axis
    model: int = resumable(1)  # tensor parallelism over heads / MLP / vocab
    fsdp: bool = resumable(False)  # also shard parameters and optimizer state over the data axis
    # processes (hosts) of a run; "auto" (0): found by jax.distributed under SLURM, Cloud TPU,
    # Open MPI or Kubernetes; above 1: with the coordinator (host:port of process 0) and this
    # process's id given by hand
    num_processes: int = resumable(1, words={"auto": AUTO})
    coordinator: str = resumable("")
    process_id: int = resumable(0)  # 0 .. num_processes - 1

    def __post_init__(self):
        require(self.data == -1 or self.data > 0, "mesh.data", "must be -1 or positive")
        positive(self, "mesh", "model")
        require(self.num_processes >= 0, "mesh.num_processes",
                f"must be auto (0) or positive, got {self.num_processes}")
        require(self.num_processes == AUTO or 0 <= self.process_id < self.num_processes,
                "mesh.process_id", f"must be in [0, {self.num_processes})")
        require(self.num_processes <= 1 or bool(self.coordinator), "mesh.coordinator",
                "is required when num_processes > 1 (or give num_processes auto)")
