"""The executors of an experiment's units (experiments/executors.py) on one tiny plan: a real
local Ray cluster and submitit's local executor give the local executor's rows bit for bit;
a unit whose process is killed under Ray is retried, resumes from its checkpoint and ends
bit for bit; on SLURM (stand-in sbatch, srun, sacct, squeue on the PATH) each stage is one
array job of its units, after the stage before (--dependency=afterok).

Every run is a `depth_sweep run` subprocess with XLA's one-thread flags, which a unit's
process gets from the local pool and Ray alike, so that all of them compute the same."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _train_helpers import REPO, subprocess_env
from jaxdepth.analysis.results import load_rows
from jaxdepth.experiments.depth_sweep import Sweep
from jaxdepth.experiments.workers import ONE_THREAD

ray = pytest.importorskip("ray", reason="the cluster extra (ray) is not installed")
submitit = pytest.importorskip("submitit", reason="the cluster extra (submitit) is not installed")

# two units: a pretraining long enough to be killed mid-way (checkpoints every 100 steps),
# and the fine-tuning that reads it
PLAN = ["--size", "tiny", "--depths", "1", "--seeds", "0", "--tasks", "passivization",
        "--scratch", "none", "--pretrain", "run.steps=300", "--pretrain", "run.save_every=100",
        "--pretrain", "run.log_every=1", "--pretrain", "data.batch_size=8", "--pretrain",
        "data.seq_len=32", "--pretrain", "data.grammar_docs=600", "--pretrain",
        "optim.warmup_steps=2", "--finetune", "run.steps=4", "--finetune", "run.eval_every=4",
        "--finetune", "run.save_every=4", "--finetune", "data.batch_size=8", "--finetune",
        "data.seq_len=128", "--finetune", "task.n_train=16", "--finetune", "task.n_eval=4",
        "--finetune", "task.pack=true"]


def _env(**extra) -> dict:
    env = subprocess_env()
    env["XLA_FLAGS"] = f"{env['XLA_FLAGS']} {ONE_THREAD}"
    # the test's own cluster on this machine: Ray's token authentication (on by default for
    # local clusters since 2.59) left out, as for a cluster behind its own network
    env["RAY_AUTH_MODE"] = "disabled"
    return {**env, **extra}


def _sweep(out: Path, *args: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxdepth.experiments.depth_sweep", "run",
                           "--out", str(out), *PLAN, *args], cwd=REPO, capture_output=True,
                          text=True, env=env or _env(), timeout=timeout)


def _rows(out: Path) -> dict:
    return {Sweep.result_name(r): {k: v for k, v in r.items() if k != "provenance"}
            for r in load_rows(out)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The plan run by the local executor, in the command's own process."""
    out = tmp_path_factory.mktemp("local") / "sweep"
    res = _sweep(out)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(out)
    assert sorted(rows) == ["finetune-passivization-L1-s0", "pretrain-L1-s0"]
    return rows


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """One local Ray cluster (two CPUs and one GPU, a resource Ray only counts here) for the
    module's runs to join: its address."""
    import socket

    with socket.socket() as s:  # a free port for its head
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tmp_path_factory.mktemp("ray")
    start = subprocess.run(["ray", "start", "--head", "--num-cpus", "2", "--num-gpus", "1",
                            "--port", str(port),
                            "--include-dashboard", "false", "--disable-usage-stats",
                            "--temp-dir", str(temp)],
                           capture_output=True, text=True, env=_env(), timeout=180)
    assert start.returncode == 0, start.stderr[-3000:]
    yield f"127.0.0.1:{port}"
    subprocess.run(["ray", "stop", "--force"], capture_output=True, env=_env(), timeout=180)


@pytest.mark.slow
def test_ray_gives_the_local_executor_s_rows(tmp_path, reference, ray_cluster):
    """With a GPU asked for each unit: Ray gives each its GPU (the unit's process sees it in
    CUDA_VISIBLE_DEVICES; jax on this CPU machine leaves it alone)."""
    res = _sweep(tmp_path / "sweep", "--executor", "ray", "--ray-address", ray_cluster,
                 "--gpus-per-unit", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == ["pretrain-L1: done", "finetune-passivization-L1: done"]
    assert _rows(tmp_path / "sweep") == reference
    for unit in ("pretrain-L1", "finetune-passivization-L1"):
        log = (tmp_path / "sweep" / "logs" / f"{unit}.log").read_text()
        assert f"{unit}: GPUs 0\n" in log, log[:300]


@pytest.mark.slow
def test_a_killed_unit_is_retried_by_ray_and_ends_bit_for_bit(tmp_path, reference,
                                                               ray_cluster):
    out = tmp_path / "sweep"
    run = out / "pretrain" / "L1-s0"
    killed = []

    def kill_mid_way():  # once the unit trained past its checkpoint of step 100
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            try:
                steps = [json.loads(line)["step"] for line in
                         (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
            except (OSError, ValueError):
                steps = []
            if steps and max(steps) >= 120:
                pid = int((run / ".lock").read_text())
                os.kill(pid, 9)
                killed.append(max(steps))
            time.sleep(0.05)

    killer = threading.Thread(target=kill_mid_way, daemon=True)
    killer.start()
    res = _sweep(out, "--executor", "ray", "--ray-address", ray_cluster)
    killer.join()
    assert killed and killed[0] < 300, "the unit was not killed mid-way"
    assert res.returncode == 0, res.stderr[-3000:]
    log = (out / "logs" / "pretrain-L1.log").read_text()
    assert log.count("pretrain L1 seed 0 ...") == 2  # started, killed, retried
    assert _rows(out) == reference


@pytest.mark.slow
def test_submitit_s_local_executor_gives_the_local_executor_s_rows(tmp_path, reference):
    res = _sweep(tmp_path / "sweep", "--executor", "slurm")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _rows(tmp_path / "sweep") == reference
    # one array job per stage: the pretraining, then the fine-tuning that reads it
    assert [line.split(" as job ")[0] for line in res.stdout.splitlines()
            if line.startswith("submitted ")] == [
        "submitted pretrain-L1", "submitted finetune-passivization-L1"]


_SBATCH = """#!/usr/bin/env python3
import os, pathlib, pickle, re, sys
d = pathlib.Path(os.environ["FAKE_SLURM"])
n = 1000 + len(list(d.glob("*.sh")))
script = pathlib.Path(sys.argv[-1]).read_text()
(d / f"{n}.sh").write_text(script)
# each task failed at once: its result, as submitit's job would write it
folder = pathlib.Path(re.search(r"#SBATCH --output=(\\S+)", script).group(1)).parent
for a in range(int(re.search(r"--array=0-(\\d+)", script).group(1)) + 1):
    (folder / f"{n}_{a}_0_result.pkl").write_bytes(
        pickle.dumps(("error", "stand-in SLURM: nothing ran")))
print(f"Submitted batch job {n}")
"""
_SACCT = """#!/usr/bin/env python3
import sys
print("JobID|State|NodeList")
for j in [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "-j"]:
    print(f"{j}_[0-99]|FAILED|node1")
"""


@pytest.mark.slow
def test_on_slurm_each_stage_is_an_array_job_after_the_one_before(tmp_path):
    """Stand-in sbatch (records the job script, and fails every task at once), srun, squeue
    and sacct (every job FAILED): nothing runs here, the submission is what is checked."""
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    for name, text in (("sbatch", _SBATCH), ("sacct", _SACCT), ("srun", "#!/bin/sh\n"),
                       ("squeue", "#!/bin/sh\n"), ("scancel", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "sweep"
    env = _env(FAKE_SLURM=str(jobs), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    res = subprocess.run([sys.executable, "-m", "jaxdepth.experiments.depth_sweep", "run",
                          "--out", str(out), *PLAN, "--seeds", "0,1", "--sequential",
                          "--executor", "slurm", "--slurm", "slurm_partition=cpu",
                          "--slurm", "timeout_min=30"], cwd=REPO, capture_output=True,
                         text=True, env=env, timeout=600)
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr[-3000:]
    assert [f"{u} (job {j}: stand-in SLURM: nothing ran)" for u, j in (
        ("pretrain-L1-s0", "1000_0"), ("pretrain-L1-s1", "1000_1"),
        ("finetune-passivization-L1-s0", "1001_0"), ("finetune-passivization-L1-s1", "1001_1"))
            ] == res.stderr.removeprefix("error: ").split("; ")[:4], res.stderr
    scripts = [(jobs / f"{n}.sh").read_text() for n in (1000, 1001)]
    assert sorted(p.name for p in jobs.iterdir()) == ["1000.sh", "1001.sh"]
    # stage 1: the two seeds' pretrainings, one array; stage 2 its fine-tunings, after it
    assert "#SBATCH --array=0-1%2" in scripts[0] and "--dependency" not in scripts[0]
    assert "#SBATCH --array=0-1%2" in scripts[1]
    assert "#SBATCH --dependency=afterok:1000" in scripts[1]
    assert all("#SBATCH --partition=cpu" in s and "#SBATCH --time=30" in s for s in scripts)
