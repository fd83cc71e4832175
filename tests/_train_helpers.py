"""Helpers for tests/trainer/test_training.py: run train.py (in a subprocess or in-process), read
back metrics and checkpoints, and snapshot directories."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from conftest import FAST_COMPILE
from jaxdepth.config import Config, MeshConfig
from jaxdepth.tasks import task_for
from jaxdepth.optim import make_optimizer
from jaxdepth.trainer.sharding import make_mesh
from jaxdepth.trainer import checkpoint as ckpt
from jaxdepth.trainer.state import state_shardings

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"
TIMEOUT = 240  # seconds for one subprocess; a hang fails the test instead of blocking CI

GRAMMAR_DOCS = 300
SEQ_LEN = 32
BATCH = 8


def base_args(run_dir, tokenizer, steps: int, **fields) -> list[str]:
    """A tiny tiny-L2 run (d_model 64, d_ff 256, 2 layers, vocab 512) with a shared tokenizer.

    fields: "section.field" -> value overrides (use a dict with dotted keys via **{...}).
    """
    args = {
        "run.dir": run_dir, "run.steps": steps, "run.log_every": 1, "run.eval_every": 1000,
        "run.save_every": steps, "run.progress": "false", "run.samples": 0,
        # sampling compiles its own programs; tests/data/embedded/test_recognizer.py
        "run.grammar_samples": 0,
        "data.grammar_docs": GRAMMAR_DOCS, "data.seq_len": SEQ_LEN, "data.batch_size": BATCH,
        "data.tokenizer": tokenizer,
    }
    return flags(["--preset", "tiny-L2"], read_by_kind(["--preset", "tiny-L2"], args, fields))


def flags(prefix: list[str], fields: dict) -> list[str]:
    return prefix + [x for k, v in fields.items() for x in (f"--{k}", str(v))]


def read_by_kind(prefix: list[str], defaults: dict, fields: dict) -> dict:
    """defaults (a helper's settings for every kind of run), less those the run's kind does not
    read (RunKind.READS: train.py refuses them), then fields, the test's own, kept whole."""
    from jaxdepth.config.cli import parse_args
    from jaxdepth.config import ConfigError
    from jaxdepth.config.run_kinds import KINDS, kind_of

    def declared(k: str):
        return KINDS.readers(k)
    undeclared = {k: v for k, v in defaults.items() if declared(k) is None}
    try:
        kind = kind_of(parse_args(flags(prefix, {**undeclared, **fields}))).NAME
    except ConfigError:  # a test of a bad config: train.py is to say what is wrong with it
        return {**defaults, **fields}
    return {**{k: v for k, v in defaults.items() if kind in (declared(k) or (kind,))}, **fields}


def subprocess_env(devices: int = 1, cache_dir=None) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if cache_dir is not None:  # identical programs compiled by several subprocesses: compile once
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def run_train(args: list[str], devices: int = 1, cache_dir=None,
              timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TRAIN_PY), *args], cwd=REPO, capture_output=True,
                          text=True, env=subprocess_env(devices, cache_dir), timeout=timeout)


def start_train(args: list[str], devices: int = 1, cache_dir=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TRAIN_PY), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env(devices, cache_dir), **kw)


def slurm_envs(n: int, devices: int = 1, cache_dir=None) -> list[dict]:
    """The environments srun gives the n tasks of one job on this machine: jax.distributed
    finds the coordinator (the first node, on port job id % 4096 + 61440), the process count
    and each process's id there, as on a SLURM cluster. The job id is chosen for a free port."""
    for port in range(61440 + os.getpid() % 4000, 65536):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
    base = subprocess_env(devices, cache_dir)
    base = {k: v for k, v in base.items() if not k.startswith("SLURM_")}
    return [{**base, "SLURM_JOB_ID": str(port - 61440 + 4096), "SLURM_NTASKS": str(n),
             "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "SLURM_NODEID": "0",
             "SLURM_STEP_NODELIST": "localhost"} for i in range(n)]


def start_processes(args: list[str], n: int, devices: int = 1, cache_dir=None,
                    command: list[str] | None = None) -> list[subprocess.Popen]:
    """n processes of one run under a stand-in SLURM job (slurm_envs), each `command` (default
    train.py) with args."""
    command = command or [sys.executable, str(TRAIN_PY)]
    return [subprocess.Popen([*command, *args], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
            for env in slurm_envs(n, devices, cache_dir)]


def finish(procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> list[tuple[int, str]]:
    """(exit code, stderr) of each process; all are killed if one does not end in time."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            kill(p)
    return [(p.returncode, err) for p, (_, err) in zip(procs, outs)]


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)


def read_metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written when we looked (polling)
            pass
    return recs


def step_losses(run_dir) -> dict[int, list[float]]:
    """step -> every training loss logged for it (a resumed run may log a step twice)."""
    out: dict[int, list[float]] = {}
    for r in read_metrics(run_dir):
        if "loss" in r:
            out.setdefault(r["step"], []).append(r["loss"])
    return out


def wait_for_step(proc: subprocess.Popen, run_dir, step: int, timeout: float = TIMEOUT) -> int:
    """Poll metrics.jsonl until a training step >= step is logged; returns the step seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logged = step_losses(run_dir)
        if logged and max(logged) >= step:
            return max(logged)
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"train.py exited ({proc.returncode}) before step {step}:\n{err[-3000:]}")
        time.sleep(0.02)
    raise AssertionError(f"no step >= {step} in {run_dir}/metrics.jsonl after {timeout}s")


def committed_steps(run_dir) -> list[int]:
    d = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def load_state(run_dir, step: int | None = None):
    """(step, state as the checkpoint holds it: a run of one without its trial axis) of a
    checkpoint, restored onto one device with the package's own abstract state (built from
    the config saved in the checkpoint)."""
    mngr = ocp.CheckpointManager(Path(run_dir).absolute() / "checkpoints")
    try:
        step = mngr.latest_step() if step is None else step
        assert step is not None, f"no checkpoint in {run_dir}"
        saved = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
        cfg = Config.from_dict(saved)
        mesh = make_mesh(MeshConfig(data=1, model=1))
        layout, shardings = ckpt.layouts(*state_shardings(
            [cfg], make_optimizer(cfg.optim, cfg.run.steps), mesh, task_for(cfg)))
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                              layout, shardings)
        state = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target))).state
    finally:
        mngr.close()
    return step, state


def saved_partition_specs(run_dir, step: int) -> dict[str, list]:
    """Dotted state path -> partition spec of the array as it was when saved (Orbax records
    each array's actual sharding in state/_sharding, keyed by the base64 of the path)."""
    raw = json.loads((Path(run_dir) / "checkpoints" / str(step) / "state" / "_sharding").read_text())
    return {base64.b64decode(k).decode(): json.loads(v)["partition_spec"] for k, v in raw.items()}


def leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def snapshot(directory) -> dict[str, tuple]:
    """relative path -> (size, mtime_ns, sha256) of every file under directory."""
    out = {}
    for p in sorted(Path(directory).rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(directory))] = (st.st_size, st.st_mtime_ns,
                                                  hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_main(script: str):
    """main(argv) -> exit code of train.py or eval.py, imported from the repository root."""
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(script.replace(".", "_"), root / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main
