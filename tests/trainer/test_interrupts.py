"""SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) stop training after the step in
progress, with a checkpoint of that step, one line and exit code 3 (errors.EXIT_INTERRUPTED);
rerunning the same command resumes bit for bit. A second signal exits at once.

Real signals to train.py in a subprocess (tiny-L2, one device); the runs share a persistent
compilation cache.
"""
from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys

import pytest

from _train_helpers import (REPO, base_args, committed_steps, read_metrics,
                            run_train, start_train, step_losses, subprocess_env, wait_for_step)
from jaxdepth.errors import EXIT_INTERRUPTED

STEPS = 100  # long enough (tens of ms a step) for a signal sent at step 2 to arrive before the end


@pytest.fixture(scope="module")
def jit_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jit_cache")


def args(run, tokenizer) -> list[str]:
    # a checkpoint only at the end: one at the stop step is the stop's own
    return base_args(run, tokenizer, STEPS, **{"run.save_every": STEPS, "run.grammar_samples": 0,
                                               "mesh.data": 1})


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tokenizer, jit_cache):
    run = tmp_path_factory.mktemp("straight") / "run"
    res = run_train(args(run, tokenizer), cache_dir=jit_cache)
    assert res.returncode == 0, res.stderr[-3000:]
    return run


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_it_stops_at_and_the_rerun_resumes_bit_for_bit(
        tmp_path, tokenizer, jit_cache, straight_run, sig):
    run = tmp_path / "run"
    proc = start_train(args(run, tokenizer), cache_dir=jit_cache)
    try:
        wait_for_step(proc, run, 2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED == 3, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    name = sig.name
    match = re.search(rf"^stopped at step (\d+) by {name}: checkpoint of step (\d+) saved; "
                      rf"rerun the same command to resume$", err, re.M)
    assert match and match.group(1) == match.group(2), err[-3000:]
    stop = int(match.group(1))
    assert err.splitlines()[-2:] == [
        f"{name}: stopping after the current step, once its checkpoint is saved (send it again "
        f"to exit at once, without saving)", match.group(0)]
    assert 2 <= stop < STEPS
    assert committed_steps(run) == [stop]
    assert max(step_losses(run)) == stop
    assert not (run / "summary.json").exists()  # the mark of a finished run
    if sig != signal.SIGTERM:
        return  # the same stop and save: SIGTERM's rerun covers the resume of both

    res = run_train(args(run, tokenizer), cache_dir=jit_cache)  # the same command resumes
    assert res.returncode == 0, res.stderr[-3000:]
    got, want = step_losses(run), step_losses(straight_run)
    assert got == want  # every step logged once (none redone, none skipped), bit for bit
    valid = [[r["valid_loss"] for r in read_metrics(d) if "valid_loss" in r]
             for d in (run, straight_run)]
    assert valid[0] == valid[1] and len(valid[0]) == 1
    assert committed_steps(run) == [stop, STEPS]


def test_a_second_signal_exits_at_once_and_handlers_are_restored():
    script = """
import os, signal, threading, time
from jaxdepth.trainer.signals import StopSignals

before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
def in_thread():
    with StopSignals():  # not the main thread: nothing installed
        print("thread", {s: signal.getsignal(s) for s in before} == before, flush=True)
t = threading.Thread(target=in_thread)
t.start()
t.join()
with StopSignals():
    print("installed", any(signal.getsignal(s) is before[s] for s in before), flush=True)
print("restored", {s: signal.getsignal(s) for s in before} == before, flush=True)
with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    while not stop.signum:
        time.sleep(0.01)
    print("first", stop.signum, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
print("not reached", flush=True)
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, env=subprocess_env(), timeout=240)
    assert res.returncode == -signal.SIGTERM, res.stderr[-3000:]
    assert res.stdout.splitlines() == ["thread True", "installed False", "restored True",
                                       f"first {int(signal.SIGTERM)}"]
    assert res.stderr.splitlines() == [
        "SIGTERM: stopping after the current step, once its checkpoint is saved (send it again "
        "to exit at once, without saving)",
        "SIGTERM again: exiting at once, without saving"]


def test_another_signal_while_stopping_is_the_same_stop():
    """A Ctrl-C reaches a sweep's worker from the terminal, then as the SIGTERM its parent
    forwards: still the one stop with its save; only the same signal again exits at once."""
    script = """
import os, signal, time
from jaxdepth.trainer.signals import StopSignals

with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    while not stop.signum:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    print("stopping on", stop.signum, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, env=subprocess_env(), timeout=240)
    assert res.returncode == -signal.SIGINT, res.stderr[-3000:]
    assert res.stdout.splitlines() == [f"stopping on {int(signal.SIGINT)}"]
    assert res.stderr.splitlines() == [
        "SIGINT: stopping after the current step, once its checkpoint is saved (send it again "
        "to exit at once, without saving)",
        "SIGTERM: already stopping after the current step (SIGINT)",
        "SIGINT again: exiting at once, without saving"]


def _train_py(tokenizer, run, prelude: str, steps: int,
              cache_dir=None) -> subprocess.CompletedProcess:
    """train.py run as its own __main__, for `steps` steps, in a process that first runs
    `prelude`."""
    argv = ["train.py", *map(str, args(run, tokenizer)), f"--run.steps={steps}"]
    script = prelude + f"""
import runpy, sys
sys.argv = {argv!r}
runpy.run_path({str(REPO / "train.py")!r}, run_name="__main__")
"""
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env=subprocess_env(cache_dir=cache_dir), timeout=240)


def test_a_ctrl_c_while_the_process_exits_ends_it_without_a_traceback(tmp_path, tokenizer):
    """What is left after train.py's last line is the interpreter's clean-up (jax's atexit
    callbacks): a Ctrl-C there, such as a second one after a stop, ends the process at once
    (130 in a shell) instead of printing a KeyboardInterrupt traceback from inside a callback.
    The Ctrl-C is sent by the last atexit callback to run (the first registered); a config
    error is the quickest way out of train.py, and every way out ends through the same line."""
    res = _train_py(tokenizer, tmp_path / "run", """
import atexit, os, signal, time
def clean_up():  # as jax's does, work that a Ctrl-C lands in
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
atexit.register(clean_up)
""", steps=-1)
    assert res.returncode == -signal.SIGINT, res.stderr[-3000:]
    assert res.stderr.splitlines() == ["config error: run.steps: must be positive, got -1"], \
        res.stderr[-3000:]


def test_a_signal_during_the_final_evaluation_lets_the_finished_run_write_its_summary(
        tmp_path, tokenizer, jit_cache):
    """Every step is trained and saved when the final evaluation starts: a SIGTERM then (sent
    here by the evaluation itself) lets it finish, writes summary.json and exits 0."""
    run = tmp_path / "run"
    res = _train_py(tokenizer, run, """
import os, signal
from jaxdepth.trainer.trials import Trials
evaluate = Trials.evaluate
def signalled(self, state, step, sharding, final):
    if final:
        os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(self, state, step, sharding, final)
Trials.evaluate = signalled
""", steps=3, cache_dir=jit_cache)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.splitlines()[-1:] == [
        "SIGTERM: the last step is trained and saved; finishing the final evaluation and "
        "summary.json (send it again to exit at once, without them: rerunning the same command "
        "then evaluates again)"], res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["done"] and summary["step"] == 3 and "valid_loss" in summary


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_stop_at_the_same_step_when_one_gets_the_signal(tmp_path, tokenizer):
    from _train_helpers import free_port, kill

    run = tmp_path / "run"

    def start():
        port = free_port()
        return [start_train(base_args(run, tokenizer, STEPS, **{
            "run.save_every": STEPS, "run.grammar_samples": 0, "mesh.data": 2,
            "mesh.coordinator": f"127.0.0.1:{port}", "mesh.num_processes": 2,
            "mesh.process_id": i}), devices=1) for i in range(2)]

    procs = start()
    try:
        wait_for_step(procs[0], run, 2)
        procs[1].send_signal(signal.SIGTERM)  # one host only
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            kill(p)
    assert [p.returncode for p in procs] == [3, 3], errs[0][-2000:] + errs[1][-2000:]
    stops = [re.findall(r"^stopped at step (\d+) by SIGTERM", e, re.M) for e in errs]
    assert stops[0] == stops[1] and len(stops[0]) == 1, errs
    stop = int(stops[0][0])
    assert committed_steps(run) == [stop]
    step_dir = run / "checkpoints" / str(stop)
    saved = json.loads((step_dir / "fingerprints" / "metadata").read_text())
    for i in range(2):  # each process's data state, digested by it, recorded by process 0
        data = (step_dir / "data" / f"process_{i}-of-2.json").read_bytes()
        assert saved[f"data/process_{i}-of-2.json"] == hashlib.sha256(data).hexdigest()
    # both resume from it, and every step is logged once
    procs = start()
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            kill(p)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert "warning" not in outs[0][1] + outs[1][1]
    logged = step_losses(run)
    assert sorted(logged) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in logged.values())
