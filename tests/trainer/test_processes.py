"""Multi-host without hand-written ids (trainer/processes.py): processes started as srun
starts a job's tasks (a stand-in SLURM environment on this machine) find each other with
``--mesh.num_processes auto``, and train what one process with all their devices trains: data
and model axes with FSDP, trials, a resume on another number of processes, a sweep unit.
A process that does not see process 0's run directory is refused, in every process, in one
line.

Every run is a tiny tiny-L2 model on the embedded grammar corpus (as test_training.py's);
reductions over two processes round differently from one process's: 1e-5."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from _train_helpers import (REPO, TRAIN_PY, base_args, finish, leaves,
                            load_state, read_metrics, run_train, slurm_envs, start_processes,
                            step_losses, subprocess_env)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS = 4
AUTO = {"mesh.num_processes": "auto"}


@pytest.fixture(scope="module")
def jit_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jit_cache")


def _records(run_dir, key: str) -> dict:
    """(step, trial) -> the value of `key` of every record that has it."""
    return {(r["step"], r.get("trial")): r[key] for r in read_metrics(run_dir) if key in r}


def _equal_runs(got, want, states: bool = True) -> None:
    """Equal losses and validation losses of every step (and trial), and (states) equal
    checkpointed states of a run without trials."""
    for key in ("loss", "valid_loss"):
        a, b = _records(got, key), _records(want, key)
        assert sorted(a) == sorted(b) and a, (key, sorted(a), sorted(b))
        np.testing.assert_allclose([a[s] for s in sorted(a)], [b[s] for s in sorted(a)],
                                   rtol=0, atol=1e-5, err_msg=key)
    if states:
        for x, y in zip(leaves(load_state(got)[1]), leaves(load_state(want)[1]), strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def _both(tmp_path, tokenizer, jit_cache, fields: dict, devices: int):
    """The run with `fields` by two processes of `devices` devices each (auto) and by one
    process of twice as many; both must succeed."""
    two, one = tmp_path / "two", tmp_path / "one"
    procs = start_processes(base_args(two, tokenizer, STEPS, **fields, **AUTO), 2, devices,
                            jit_cache)
    ref = run_train(base_args(one, tokenizer, STEPS, **fields), devices=2 * devices,
                    cache_dir=jit_cache)
    for code, err in finish(procs):
        assert code == 0, err[-3000:]
    assert ref.returncode == 0, ref.stderr[-3000:]
    return two, one


def test_auto_processes_with_data_model_and_fsdp_equal_one_process_of_all_devices(
        tmp_path, tokenizer, jit_cache):
    fields = {"mesh.data": 4, "mesh.model": 2, "mesh.fsdp": "true", "run.eval_every": 2,
              "run.save_every": 2}
    two, one = _both(tmp_path, tokenizer, jit_cache, fields, devices=4)
    _equal_runs(two, one)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["devices"] == 8


def test_trials_across_processes_equal_the_trials_in_one_process(tmp_path, tokenizer,
                                                                  jit_cache):
    """Two seeds as trials: across processes each trial's rows are split over the data axis
    (each process reads its rows of every trial), in one process each trial has a device."""
    two, one = _both(tmp_path, tokenizer, jit_cache,
                     {"mesh.data": 2, "run.seeds": "0,1", "run.eval_every": 2}, devices=1)
    _equal_runs(two, one, states=False)  # (the sweep's test below compares exported trials)
    for k in range(2):  # what each trial's evaluation wrote, by process 0 alone
        a = json.loads((two / "summary.json").read_text())["trials"][k]
        b = json.loads((one / "summary.json").read_text())["trials"][k]
        np.testing.assert_allclose(a["valid_loss"], b["valid_loss"], rtol=0, atol=1e-5)


def test_a_run_of_two_processes_resumes_in_one(tmp_path, tokenizer, jit_cache):
    """Its data order is a function of the step: the one process takes the state both
    processes saved and reads the same global batches."""
    run, straight = tmp_path / "run", tmp_path / "straight"
    fields = {"mesh.data": 2, "run.save_every": 2}
    procs = start_processes(base_args(run, tokenizer, STEPS, **fields, **AUTO,
                                      **{"run.stop_after": 2}), 2, 1, jit_cache)
    for code, err in finish(procs):
        assert code == 0, err[-3000:]
    assert sorted(step_losses(run)) == [1, 2]
    res = run_train(base_args(run, tokenizer, STEPS, **fields), devices=2, cache_dir=jit_cache)
    assert res.returncode == 0, res.stderr[-3000:]
    ref = run_train(base_args(straight, tokenizer, STEPS, **fields), devices=2,
                    cache_dir=jit_cache)
    assert ref.returncode == 0, ref.stderr[-3000:]
    _equal_runs(run, straight)


def test_a_process_that_does_not_see_the_run_directory_is_refused_in_one_line(
        tmp_path, tokenizer, jit_cache):
    """Process 1 is given another directory, as a host with its own disk would see: both
    processes stop with the same one line, before anything is trained or saved."""
    argv = [base_args(tmp_path / d, tokenizer, STEPS, **AUTO) for d in ("shared", "own")]
    procs = [subprocess.Popen([sys.executable, str(TRAIN_PY), *a], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for a, env in zip(argv, slurm_envs(2, 1, jit_cache))]
    results = finish(procs)
    lines = []
    for code, err in results:
        assert code == 2, err[-3000:]
        lines.append(err.strip().splitlines()[-1])
    for line in lines:
        assert "run.dir: process 1 of 2 does not see process 0's" in line, line
        assert "shared storage" in line and "Traceback" not in line
    assert not (tmp_path / "shared" / "checkpoints").exists()
    assert not (tmp_path / "own" / "checkpoints").exists()


def test_auto_without_a_cluster_environment_says_what_to_give(tmp_path, tokenizer):
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("SLURM_", "OMPI_"))}
    res = subprocess.run([sys.executable, "-m", "jaxdepth.train",
                          *base_args(tmp_path / "run", tokenizer, STEPS, **AUTO)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "mesh.num_processes: auto found no cluster environment" in line
    assert "mesh.coordinator" in line


# a sweep of one depth, two seeds as the trials of each unit: pretraining (trials exported to
# each seed's directory) and a fine-tuning with exact-match decoding
SWEEP_PLAN = ["--size", "tiny", "--depths", "1", "--seeds", "0,1", "--tasks", "passivization",
              "--scratch", "none", "--pretrain", "run.steps=6", "--pretrain", "run.save_every=3",
              "--pretrain", "data.batch_size=8", "--pretrain", "data.seq_len=32",
              "--pretrain", "data.grammar_docs=600", "--pretrain", "optim.warmup_steps=2",
              "--finetune", "run.steps=4", "--finetune", "run.eval_every=4", "--finetune",
              "run.save_every=4", "--finetune", "data.batch_size=8", "--finetune",
              "data.seq_len=128", "--finetune", "task.n_train=16", "--finetune",
              "task.n_eval=4", "--finetune", "task.pack=true"]
SWEEP = [sys.executable, "-m", "jaxdepth.experiments.depth_sweep"]


def test_a_sweep_unit_runs_across_processes(tmp_path, jit_cache):
    """`unit NAME --processes auto` under srun: the unit's rows equal the same unit's in one
    process with both devices (the fine-tuning's exact match, decoded by both processes,
    equal to the digit)."""
    from jaxdepth.analysis.results import load_rows

    outs = {d: tmp_path / d for d in ("two", "one")}
    for out in outs.values():
        res = subprocess.run([*SWEEP, "plan", "--out", str(out), *SWEEP_PLAN], cwd=REPO,
                             capture_output=True, text=True, env=subprocess_env(2), timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
    units = [u["name"] for u in json.loads(res.stdout)["units"] if not u["analysis"]]
    assert units == ["pretrain-L1", "finetune-passivization-L1"]
    for unit in units:
        procs = start_processes(["unit", unit, "--out", str(outs["two"]), "--processes",
                                 "auto"], 2, 1, jit_cache, command=SWEEP)
        res = subprocess.run([*SWEEP, "unit", unit, "--out", str(outs["one"])], cwd=REPO,
                             capture_output=True, text=True,
                             env=subprocess_env(2, jit_cache), timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        for code, err in finish(procs, timeout=600):
            assert code == 0, err[-3000:]
    rows = {d: {(r["kind"], r["seed"]): r for r in load_rows(out)} for d, out in outs.items()}
    assert sorted(rows["two"]) == sorted(rows["one"]) == [
        ("finetune", 0), ("finetune", 1), ("pretrain", 0), ("pretrain", 1)]
    for key, want in rows["one"].items():
        got = rows["two"][key]
        for name, value in want.items():
            if name == "provenance":
                continue
            if isinstance(value, float):
                np.testing.assert_allclose(got[name], value, rtol=1e-6, err_msg=name)
            else:
                assert got[name] == value, (key, name)
