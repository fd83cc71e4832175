"""The device peak and the parameter count, for MFU: a model's FLOPs per token come from the
model (models/flops.py, through the task's ``flops_per_token``)."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp


# Dense peak FLOP/s per device by device_kind, for the bf16 compute path.
_PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5": 459e12}


def measure_matmul_peak(dtype=jnp.float32, n: int = 1024, reps: int = 8) -> float:
    """Achieved FLOP/s of a large square matmul on the default device (a practical peak)."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def device_peak_flops(compute_dtype: str) -> tuple[float, str]:
    """(peak FLOP/s per device, where the number comes from)."""
    kind = jax.devices()[0].device_kind
    if compute_dtype == "bfloat16":
        for name, peak in _PEAK_BF16.items():
            if name in kind:
                return peak, f"{kind} dense bf16 datasheet"
    dtype = jnp.bfloat16 if compute_dtype == "bfloat16" else jnp.float32
    return measure_matmul_peak(dtype), f"measured {compute_dtype} 1024^3 matmul on {kind}"
