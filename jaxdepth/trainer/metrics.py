"""Metrics: one JSON object per record in metrics.jsonl, mirrored to TensorBoard."""
from __future__ import annotations

import json
from pathlib import Path


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
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(str(run_dir / "tb"))

    def write(self, step: int, **scalars) -> None:
        if not self.enabled:
            return
        rec = {"step": step, **{k: float(v) for k, v in scalars.items()}}
        self._jsonl.write(json.dumps(rec) + "\n")
        self._jsonl.flush()
        for k, v in rec.items():
            if k != "step":
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()
