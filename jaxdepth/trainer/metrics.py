"""Metrics: one JSON object per record in metrics.jsonl, mirrored to TensorBoard; and the
device peak their MFU is measured against (a model's FLOPs per token come from the model:
models/flops.py, through the task's ``flops_per_token``)."""
from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

import jax
import jax.numpy as jnp

from ..files import read_jsonl
from ..errors import writing


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


def _summary_writer():
    """tensorboardX's SummaryWriter, imported without torch. tensorboardX imports torch when it
    is installed, only to accept torch tensors (we write Python floats); that import is 3-4 s
    of every run's start-up on a CPU machine, more than a small run's compilation. While the
    block is in place (this import only, on the main thread before training starts) an
    `import torch` elsewhere would fail too."""
    import sys

    blocked = "tensorboardX" not in sys.modules and "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None  # `import torch` raises ImportError, as tensorboardX expects
    try:
        from tensorboardX import SummaryWriter
    finally:
        if blocked:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """Appends one JSON object per record to metrics.jsonl and mirrors scalars to TensorBoard.

    Only process 0 writes; other processes get a writer that does nothing.
    """

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "metrics.jsonl"
        torn = False
        if path.is_file() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
        self._jsonl = open(path, "a")
        if torn:  # a run killed mid-write left half a record: end it so the next one stays whole
            self._jsonl.write("\n")
        self._tb = _summary_writer()(str(run_dir / "tb"))

    def write(self, step: int, trial: int | None = None, **scalars) -> None:
        """One record; trial: the trial it belongs to in a run with trials (an int in the
        record, and its TensorBoard tags under trial_<k>/)."""
        if not self.enabled:
            return
        rec = {"step": step, **({} if trial is None else {"trial": int(trial)}),
               **{k: float(v) for k, v in scalars.items()}}
        with writing(self._jsonl.name):
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()
        prefix = "" if trial is None else f"trial_{trial}/"
        for k, v in rec.items():
            # a non-finite value (a trial's, as it is frozen) stays in metrics.jsonl; TensorBoard
            # would plot nothing for it and tensorboardX warns of it on every write
            if k not in ("step", "trial") and math.isfinite(v):
                self._tb.add_scalar(prefix + k, v, step)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


class TrainingClock:
    """Wall time less the time spent evaluating: what throughput is measured against."""

    def __init__(self) -> None:
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._paused

    @contextmanager
    def paused(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t0


def training_figures(path: Path, final_step: int, tokens_per_step: int) -> dict:
    """{train_loss, tokens_per_s} of a run recomputed from its metrics.jsonl (what is missing
    there is left out): the last loss logged for `final_step`, and the run's throughput,
    every token timed over every invocation divided by the time they took.

    A training record (it has a grad_norm) carries tokens_per_s for the steps since the
    previous record of the same invocation; the first record of an invocation (its step
    includes compilation) carries none, which also marks where an invocation starts.
    """
    figures: dict = {}
    if not path.is_file():
        return figures
    previous, tokens, seconds = None, 0, 0.0
    for rec in read_jsonl(path):  # (without the torn last line of a killed run)
        if "grad_norm" not in rec:
            continue
        if "tokens_per_s" in rec and previous is not None and rec["step"] > previous:
            n = (rec["step"] - previous) * tokens_per_step
            tokens, seconds = tokens + n, seconds + n / rec["tokens_per_s"]
        previous = rec["step"]
        if rec["step"] == final_step:
            figures["train_loss"] = rec["loss"]
    if seconds > 0:
        figures["tokens_per_s"] = tokens / seconds
    return figures
