"""Refuse a train step that cannot fit in memory, before it runs (docs/design.md §6, "Memory
check"): else a batch too large for the accelerator ends in an XLA RESOURCE_EXHAUSTED
traceback after minutes of set-up, and on a CPU under a cgroup limit the kernel kills the
process without a word.

The step is compiled ahead through its own ``lower`` inside its first call (so JAX's caches
serve that call: no extra trace or compile), and XLA's ``memory_analysis()`` of it gives what
it adds to what is allocated, ``temp + output - alias``. That is compared with the headroom:
each device's ``bytes_limit`` less what is in use there; on a CPU, whose arrays live in the
process's memory, the smallest of the cgroup limit (``cgroup_limit``), the address-space
limit (``RLIMIT_AS``, against what is mapped) and the physical memory, less the process's
resident memory. The config's estimate (``analytic``) is printed beside it and stands in
where a backend gives no analysis. Only a step XLA says cannot fit is refused (one line,
``DoesNotFit``, exit 2): the estimate leaves out the runtime's own overhead, so a step close
to the limit may still fail. ``JAXDEPTH_SKIP_MEMORY_CHECK=1`` skips the check.
"""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import equinox as eqx
import jax

from ..config import Config
from ..errors import UserError

SKIP_ENV = "JAXDEPTH_SKIP_MEMORY_CHECK"
# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value (or near it).
_V1_UNLIMITED = 1 << 62


class DoesNotFit(UserError):
    """The train step needs more memory than the device or the process may use."""


@dataclass(frozen=True)
class Limit:
    """What may be allocated, and by what measure: `total` bytes in all (`name` says whose
    limit), of which `used` are taken now."""
    total: int
    used: int
    name: str

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass(frozen=True)
class Estimate:
    """Bytes a step adds to what is allocated when it starts (`new`), and those already
    allocated that it reads (`arguments`), summed over the devices that share the limit."""
    new: int
    arguments: int
    source: str  # "XLA" or "config"


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# ----------------------------------------------------------------------------- limits

def _read_int(path: Path) -> int | None:
    """The number in a cgroup file; None for "max", a missing or unreadable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_limit(root: Path = Path("/sys/fs/cgroup"),
                 proc_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[int, str] | None:
    """(bytes, file) of the tightest cgroup memory limit over this process, or None.

    A limit set on any ancestor applies too, so every directory from the process's cgroup up
    to the mount is read. In a container the mount's root usually is the container's own
    cgroup while /proc/self/cgroup names the host's path, which then does not exist under it:
    the root's own file is read as well."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[Path] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = Path(path.strip().lstrip("/"))
        if controllers == "":  # v2: one unified hierarchy
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1: the memory controller's hierarchy
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        for parent in [rel, *rel.parents]:
            candidates.append(base / parent / name)
    candidates += [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    found = [(v, str(p)) for p in dict.fromkeys(candidates)
             if (v := _read_int(p)) is not None and v < _V1_UNLIMITED]
    return min(found) if found else None


def _status_kib(field: str, status: Path = Path("/proc/self/status")) -> int | None:
    """A "kB" field of /proc/self/status (VmRSS, VmSize) in bytes."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss() -> int:
    """The process's resident memory now (its peak where /proc is missing)."""
    now = _status_kib("VmRSS")
    if now is not None:
        return now
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if os.uname().sysname == "Darwin" else 1024)


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_limit() -> Limit | None:
    """The tightest of the limits on this process's memory (module docstring), or None."""
    resident = rss()
    limits = []
    cg = cgroup_limit()
    if cg is not None:
        limits.append(Limit(cg[0], resident, f"the cgroup memory limit ({cg[1]})"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        # RLIMIT_AS counts address space, not resident pages: compare with what is mapped.
        mapped = _status_kib("VmSize")
        limits.append(Limit(soft, resident if mapped is None else mapped,
                            "the address-space limit (RLIMIT_AS, ulimit -v)"))
    ram = physical_memory()
    if ram:
        limits.append(Limit(ram, resident, "the physical memory"))
    return min(limits, key=lambda lim: lim.free, default=None)


def device_limit(devices) -> Limit | None:
    """The device with the least free memory, by its allocator's statistics; None where
    the backend keeps none (CPU)."""
    limits = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # backends without statistics raise (or return None)
            stats = None
        if stats and stats.get("bytes_limit"):
            limits.append(Limit(int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0)),
                                f"the memory of {d.device_kind} {d.id}"))
    return min(limits, key=lambda lim: lim.free, default=None)


# ----------------------------------------------------------------------------- estimates

def xla_estimate(compiled, devices_sharing: int) -> Estimate | None:
    """From a compiled step (jax or equinox ``Compiled``): XLA's sizes, which are per device,
    times the devices that share one memory (every CPU device of a process, 1 on GPU/TPU)."""
    compiled = getattr(compiled, "compiled", compiled)  # equinox wraps jax's
    try:
        m = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        return None
    if m is None:
        return None
    new = m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    return Estimate(new * devices_sharing, m.argument_size_in_bytes * devices_sharing, "XLA")


def analytic(cfg: Config, state, batch, devices_sharing: int, data_shards: int,
             on_host: bool = True) -> Estimate:
    """A rough estimate from the config and the state's sizes: within about 25% of XLA's for
    the decoder of the default run on a CPU (and with 4x its batch, 2x seq_len, 4x d_ff or
    d_model, 3x the layers, each remat mode, accum_steps 4); up to 1.7x XLA's for the tests'
    tiny model (d_model 64, 2 layers), where XLA fuses away a larger share.

    Per token of a micro-batch and per layer, in elements of the compute dtype: without remat
    16 d_model + 8 d_ff + 3 heads T (what the backward pass keeps of each layer: inputs,
    norms, q/k/v, attention scores and probabilities, the gated MLP's four d_ff-wide arrays,
    and XLA's copies of them; coefficients fitted to XLA's analysis); with remat "dots" the
    matmul outputs without batch dimensions, 5 d_model + 2 d_ff; with "full" the layer input,
    d_model; with either remat, one layer's full set on top (the layer being recomputed).
    Then the float32 logits of ``model.xent_chunk`` tokens at a time (all of them if 0) in
    three copies (logits, softmax, gradient); and the gradient, its accumulator when
    ``optim.accum_steps`` > 1 and an update-sized optimizer intermediate, each the size of
    the parameters. The compute dtype is float32 on a CPU, whose XLA computes bfloat16 in
    float32. Ignored: tensor-parallel splits of activations (an over-estimate under
    mesh.model), frozen parts (no gradient), and any model other than the decoder and the
    ACT family beyond its model section's dimensions."""
    layers, d, f, h, remat, chunk = cfg.model_spec.dims()
    trials = state.n_trials
    rows, seq = next(iter(batch.values())).shape[1:3]  # one trial's rows: [K, B, T, ...]
    tokens = rows // cfg.optim.accum_steps * seq / data_shards  # per device and micro-batch
    width = 2 if cfg.model.compute_dtype == "bfloat16" and not on_host else 4
    whole_layer = 16 * d + 8 * f + 3 * h * seq
    mode = {True: "full", False: "none"}.get(remat, remat)
    kept = {"none": layers * whole_layer,
            "dots": layers * (5 * d + 2 * f) + whole_layer,
            "full": layers * d + whole_layer}[mode]
    acts = tokens * width * kept * trials
    acts += 3 * 4 * cfg.vocab_size * (min(chunk, tokens) if chunk else tokens)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(state.model, eqx.is_array)))
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(state, eqx.is_array)))
    per_device = param_bytes / data_shards if cfg.mesh.fsdp else param_bytes
    grads = per_device * (3 if cfg.optim.accum_steps > 1 else 2)
    return Estimate(int((acts + grads) * devices_sharing), state_bytes, "config")


# ----------------------------------------------------------------------------- the check

def _advice(cfg: Config, rows: int) -> str:
    micro = rows // cfg.optim.accum_steps
    remat_field = f"{cfg.model_section}.remat"
    remat_now = cfg.model_spec.remat
    ways = [f"data.batch_size ({cfg.data.batch_size})"]
    if micro > 1:
        ways.append(f"raise optim.accum_steps ({cfg.optim.accum_steps}: micro-batches of "
                    f"{micro} sequences)")
    if remat_now in ("none", "dots", False):
        ways.append(f"set {remat_field} {'full' if remat_field == 'model.remat' else 'true'} "
                    f"(now {str(remat_now).lower()})")
    ways.append(f"data.seq_len ({cfg.data.seq_len})")
    return "lower " + ways[0] + ", " + ", ".join(ways[1:-1]) + " or lower " + ways[-1]


def check(cfg: Config, estimate: Estimate, fallback: Estimate | None, limit: Limit | None,
          rows: int) -> None:
    """Raise DoesNotFit when the step's new allocations exceed the limit's headroom."""
    if limit is None or estimate.new <= limit.free:
        return
    other = ("" if fallback is None or fallback is estimate
             else f"; from the config: {gib(fallback.new)}")
    raise DoesNotFit(
        f"the train step does not fit in memory: it needs {gib(estimate.new)} more "
        f"({estimate.source}'s estimate{other}) on top of the {gib(limit.used)} in use, but "
        f"{limit.name} is {gib(limit.total)}; {_advice(cfg, rows)} (or set {SKIP_ENV}=1 to "
        f"run it anyway)")


def _where(mesh) -> tuple[list, bool, int]:
    """(this process's devices, whether they are the host's CPU, how many share its memory)."""
    devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    on_host = devices[0].platform == "cpu"
    return devices, on_host, len(devices) if on_host else 1


def with_compile_check(call, lower, on_compile):
    """run(state, batch): call(state, batch), the jitted step. Its first call lowers it
    first (lower(state, batch): traced without running), so that an error in tracing leaves
    the state whole (a run of one's call donates it before its step is traced). on_compile(
    compiled, state, batch), if given, sees that lowering compiled before the call runs, and
    may refuse it by raising (step_check below): the state is still whole. The jit cache
    serves the call, so the step is still traced and compiled once. ``run.lower`` is
    `lower`."""
    first = [True]

    def run(state, batch):
        if first[0]:
            first[0] = False
            lowered = lower(state, batch)
            if on_compile is not None:
                on_compile(lowered.compile(), state, batch)
        return call(state, batch)

    run.lower = lower
    return run


def step_check(cfg: Config, mesh, limit_of: Callable[[list], Limit | None] | None = None
               ) -> Callable | None:
    """The `on_compile` of trainer/state.py's make_step: given the step compiled for its
    first call (None where it cannot be compiled ahead), raises DoesNotFit before that call
    runs if it cannot fit. None when JAXDEPTH_SKIP_MEMORY_CHECK is set. limit_of(devices)
    replaces the limit (tests)."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return None
    devices, on_host, sharing = _where(mesh)

    def check_compiled(compiled, state, batch) -> None:
        fallback = analytic(cfg, state, batch, sharing, mesh.shape["data"], on_host)
        estimate = None if compiled is None else xla_estimate(compiled, sharing)
        limit = (limit_of or (lambda ds: host_limit() if on_host else device_limit(ds)))(devices)
        rows = next(iter(batch.values())).shape[1]
        check(cfg, estimate or fallback, fallback if estimate else None, limit, rows)

    return check_compiled


def describe(step_fn: Callable, cfg: Config, mesh, state, batch) -> dict:
    """Both estimates and the limit, in bytes, without running the step (benchmarks, tests):
    step_fn is state.make_step's, whose ``lower`` compiles it ahead."""
    devices, on_host, sharing = _where(mesh)
    out = {"config": analytic(cfg, state, batch, sharing, mesh.shape["data"], on_host).new}
    xla = xla_estimate(step_fn.lower(state, batch).compile(), sharing)
    if xla is not None:
        out.update(xla=xla.new, arguments=xla.arguments)
    limit = host_limit() if on_host else device_limit(devices)
    if limit is not None:
        out.update(limit=limit.total, used=limit.used, limit_name=limit.name)
    return out
