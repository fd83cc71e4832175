"""What the benchmarks share: running from a checkout, malloc tuning, JAX's compile events,
timing, the record of the machine, tables, JSON output and the real LM train step.

A benchmark imports this module before anything that allocates (jax, numpy arrays): importing
it puts the checkout on ``sys.path`` (the scripts run uninstalled) and, when the process is a
benchmark script, applies ``jaxdepth.trainer.runtime.tune_malloc()`` as ``train.py`` does,
so that every contestant runs with the same allocator settings (a test that imports a benchmark as a module
leaves its process's allocator alone).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from jaxdepth.trainer.runtime import tune_malloc  # noqa: E402

_MAIN = getattr(sys.modules["__main__"], "__file__", None) or ""
# before any large allocation; applies to every contestant alike
MALLOC_TUNED = Path(_MAIN).resolve().parent == Path(__file__).resolve().parent and tune_malloc()

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxdepth.config import Config  # noqa: E402
from jaxdepth.tasks import task_for  # noqa: E402
from jaxdepth.trainer.sharding import batch_sharding, make_mesh  # noqa: E402
from jaxdepth.trainer.state import start  # noqa: E402

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE_EVENTS = (TRACE_EVENT, LOWER_EVENT, BACKEND_COMPILE_EVENT)


# ----------------------------------------------------------------------------- compile events

class CompileEvents:
    """JAX's compile-duration events (by default: trace, lowering, XLA compile) while active,
    counted and summed per label: the value of ``current`` when the event came."""

    def __init__(self, events: Iterable[str] = COMPILE_EVENTS):
        self.events = tuple(events)
        self.current = "other"
        self._counts: dict[tuple[str, str], int] = {}
        self._seconds: dict[tuple[str, str], float] = {}

    def _listener(self, event: str, duration: float, **_) -> None:
        if event in self.events:
            key = (self.current, event)
            self._counts[key] = self._counts.get(key, 0) + 1
            self._seconds[key] = self._seconds.get(key, 0.0) + duration

    def _labels(self, label: str | None) -> list[str]:
        return sorted({lab for lab, _ in self._counts}) if label is None else [label]

    def count(self, label: str | None = None, event: str = BACKEND_COMPILE_EVENT) -> int:
        """How many `event`s came under `label` (None: under any label)."""
        return sum(self._counts.get((lab, event), 0) for lab in self._labels(label))

    def seconds(self, label: str | None = None, event: str | None = None) -> float:
        """Seconds of `event` (None: of every watched event) under `label` (None: any)."""
        events = self.events if event is None else (event,)
        return sum(self._seconds.get((lab, e), 0.0) for e in events for lab in self._labels(label))

    def breakdown(self, label: str | None = None) -> dict[str, float]:
        """Seconds per watched event, keyed by the event's last path part."""
        return {e.rsplit("/", 1)[1]: self.seconds(label, e) for e in self.events}

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


# ----------------------------------------------------------------------------- timing

def timed(fn: Callable, *args, block: bool = True):
    """(fn(*args), seconds it took). With block, the time includes waiting for every array in
    the result (jax.block_until_ready); without, fn must return only when its work is done."""
    t0 = time.perf_counter()
    out = fn(*args)
    if block:
        out = jax.block_until_ready(out)
    return out, time.perf_counter() - t0


def interleaved_times(calls: dict[str, Callable[[], object]],
                      repeats: int) -> dict[str, list[float]]:
    """Seconds of every call (blocked until ready) in `repeats` rounds. Each round calls all of
    them, starting one further along than the round before, so machine drift hits all alike."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(timed(calls[name])[1])
    return times


def median_time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of fn() (which must block) over reps calls after one untimed call."""
    fn()
    return statistics.median(timed(fn, block=False)[1] for _ in range(reps))


# ----------------------------------------------------------------------------- the record

def environment(**extra) -> dict:
    """The software and machine a result was measured on (extra: more fields, or overrides)."""
    return {"jax": jax.__version__, "equinox": eqx.__version__, "backend": jax.default_backend(),
            "device_kind": jax.devices()[0].device_kind, "device_count": jax.device_count(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "malloc_tuned": MALLOC_TUNED, **extra}


def write_json(path, record: dict) -> Path:
    """Write record as indented JSON to path (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    return path


def print_table(header: str, rows: Iterable[str]) -> None:
    """A text table: the header, a rule as wide as the header, then the rows."""
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of the benchmark's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


# ----------------------------------------------------------------------------- the LM train step

def random_lm_batch(cfg: Config, seed: int = 0) -> dict:
    """A causal-LM batch of cfg's shape: random tokens 3..V-1 (no special ids), all weighted."""
    rng = np.random.default_rng(seed)
    B, T = cfg.data.batch_size, cfg.data.seq_len
    toks = rng.integers(3, cfg.model.vocab_size, size=(B, T + 1), dtype=np.int32)
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "weights": np.ones((B, T), np.float32)}


class TrainStep:
    """The real train step of cfg, built as train.py builds it (``make_mesh``, ``task_for``,
    trainer/state.py's ``start``: one trial on its trial axis), with its state and one batch
    placed on the mesh. Calling it takes one step on that batch and returns (state, metrics
    of [1] arrays), not waited for; ``loss`` reads the last step's."""

    def __init__(self, cfg: Config, batch: dict):
        self.cfg = cfg
        self.mesh = make_mesh(cfg.mesh)
        data = self.mesh.shape["data"]
        if cfg.data.batch_size % data:
            raise ValueError(f"--batch {cfg.data.batch_size} is not divisible by the data axis "
                             f"({data} devices); pick a multiple")
        self.state, self.step_fn, _ = start([cfg], [task_for(cfg)], self.mesh)
        b_sh = batch_sharding(self.mesh, 1)
        self.batch = {k: jax.device_put(np.asarray(v)[None], b_sh) for k, v in batch.items()}
        self.metrics = None

    def __call__(self):
        self.state, self.metrics = self.step_fn(self.state, self.batch)
        return self.state, self.metrics

    def loss(self) -> float:
        return float(np.asarray(self.metrics["loss"])[0])


# ----------------------------------------------------------------------------- experiments

def fewshot_units(experiment: Path) -> dict:
    """{"method N=n trial=t": {best_dev_f1, test_f1, best_step}} of a few-shot grid's rows."""
    from jaxdepth.analysis.results import load_rows

    out = {}
    for r in load_rows(experiment):
        out[f"{r['method']} N={r['n_shot']} trial={r['seed']}"] = {
            k: r[k] for k in ("best_dev_f1", "test_f1", "best_step")}
    return out


def fewshot_grid_command(ner_dir: str, extra: str = "") -> list[str]:
    """The FE half of the miniature few-shot grid, as a command line (without --out); extra:
    more fusion_fewshot arguments, as one shell-quoted string."""
    import shlex

    return [sys.executable, "-m", "jaxdepth.experiments.fusion_fewshot", "all", "--ner-dir",
            ner_dir, "--preset", "miniature", "--modes", "fe", *shlex.split(extra)]


def last_list(argv: list[str], flag: str) -> list[str]:
    """The items of the last `flag` list in argv (argparse nargs='*' keeps the last one):
    `--flag a b` or `--flag=a b`, up to the next option."""
    starts = [i for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]
    if not starts:
        return []
    i = starts[-1]
    first = [argv[i].split("=", 1)[1]] if "=" in argv[i] else []
    rest = argv[i + 1:]
    return first + rest[:next((j for j, a in enumerate(rest) if a.startswith("--")), len(rest))]


def fewshot_backbone(base: list[str], work: Path) -> str:
    """The pretrained encoder of `base` (a fusion_fewshot command line without --out): its
    miniature pretraining and one FT unit, in a process of its own, untimed."""
    import subprocess

    subprocess.run(base + ["--out", str(work / "pretrain_only"), "--methods", "base",
                           "--shots", "8", "--modes", "ft", "--trials", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    return str(work / "pretrain_only" / "pretrain")


def two_ways(base: list[str], ways: dict[str, list[str]], work: Path, units) -> dict:
    """Wall time of one experiment command run each way (each in a fresh process, as a user
    runs it, in the order given, into work/<way>), and each way's units: {way: {"wall_s",
    "units", "results"}}. `ways` maps a name to the arguments it adds to `base`; `units` reads
    an experiment directory's results into {unit: values}."""
    import subprocess

    runs = {}
    for name, extra in ways.items():
        out = work / name
        t0 = time.perf_counter()
        subprocess.run(base + ["--out", str(out), *extra], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        got = units(out)
        runs[name] = {"wall_s": wall, "units": len(got), "results": got}
        print(f"  {name}: {wall:.1f} s for {len(got)} units", flush=True)
    return runs


def drift(a: dict, b: dict) -> dict:
    """How far two ways' results ({unit: {field: number or None}}) are apart: the units only
    one of them has, how many shared units differ at all, each field's largest absolute
    difference over the shared units, and the fields that could not be compared somewhere
    (a number on one side only, or a NaN)."""
    shared = sorted(set(a) & set(b))
    largest: dict[str, float] = {}
    incomparable: set[str] = set()
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    for u in shared:
        for field in set(a[u]) | set(b[u]):
            x, y = a[u].get(field), b[u].get(field)
            if number(x) and number(y):
                d = abs(float(x) - float(y))
                if math.isnan(d):
                    incomparable.add(field)
                else:
                    largest[field] = max(largest.get(field, 0.0), d)
            elif number(x) or number(y):
                incomparable.add(field)
    return {"only_in_one": sorted(set(a) ^ set(b)), "units_compared": len(shared),
            "units_that_differ": sum(a[u] != b[u] for u in shared),
            "largest_abs_difference": dict(sorted(largest.items())),
            "fields_not_compared": sorted(incomparable)}
