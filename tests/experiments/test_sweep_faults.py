"""The depth sweep's faults (docs/faults.md): a torn or damaged result record is set aside and
its unit redone, never swallowing another; the sweep parent killed, terminated or interrupted
with two workers running leaves no worker behind and no lock against the rerun, which resumes
bit for bit; a report names the units without a result; an unknown group is refused; a Ctrl-C
while jax is imported is one line.

The signal tests share one tiny pretraining-only plan (two depths, one seed, two pinned
workers), trained once uninterrupted as their reference."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _train_helpers import REPO, subprocess_env
from jaxdepth.analysis.results import load_rows
from jaxdepth.experiments.depth_sweep import Plan, Sweep, main

SWEEP = [sys.executable, "-m", "jaxdepth.experiments.depth_sweep"]
# Long enough (a few ms a step) that a signal sent once both workers train arrives mid-run.
PRETRAIN = ["--size", "tiny", "--depths", "1,2", "--seeds", "0", "--tasks", "none",
            "--scratch", "none", "--pretrain", "run.steps=300", "--pretrain",
            "run.save_every=300", "--pretrain", "run.log_every=1", "--pretrain",
            "data.batch_size=8", "--pretrain", "data.seq_len=32", "--pretrain",
            "data.grammar_docs=600", "--pretrain", "optim.warmup_steps=2"]
WORKERS = ["--sequential", "--workers", "2", "--pin"]
needs_two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="--pin needs Linux and two cores")


def _numbers(out: Path) -> dict:
    """Each unit's numbers (provenance aside: the pinned core may differ)."""
    return {Sweep.result_name(r): {k: v for k, v in r.items() if k != "provenance"}
            for r in load_rows(out)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xla_cache")


def _start(out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    """The sweep parent in a process group of its own (as a shell starts a job)."""
    return subprocess.Popen([*SWEEP, "run", "--out", str(out), *PRETRAIN, *WORKERS, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env(cache_dir=cache), start_new_session=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("reference") / "sweep"
    proc = _start(out, cache)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return _numbers(out)


def _worker_pids(out: Path) -> list[int]:
    """The pids the workers wrote into their runs' locks, once both are training."""
    runs = [out / "pretrain" / f"L{d}-s0" for d in (1, 2)]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if all((r / "metrics.jsonl").is_file() and (r / "metrics.jsonl").read_text().strip()
               for r in runs):
            return [int((r / ".lock").read_text()) for r in runs]
        time.sleep(0.1)
    raise AssertionError(f"the workers did not start training in {out}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def _gone(pids: list[int], within: float = 60) -> bool:
    deadline = time.monotonic() + within
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(_alive, pids))


def _finish(out: Path, cache: Path, reference: dict) -> None:
    """The same command again resumes every unit and ends with the reference's numbers."""
    proc = _start(out, cache)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert _numbers(out) == reference


@needs_two_cores
@pytest.mark.slow
def test_kill_9_of_the_sweep_parent_stops_its_workers(tmp_path, cache, reference):
    out = tmp_path / "sweep"
    proc = _start(out, cache)
    workers = _worker_pids(out)
    proc.kill()
    proc.communicate()
    assert _gone(workers), "a worker trains on without its parent"
    for d in (1, 2):  # each stopped as on SIGTERM: its step saved
        log = (out / "logs" / f"pretrain-L{d}-s0.log").read_text()
        assert re.search(r"^stopped at step \d+ by SIGTERM: checkpoint of step \d+ saved", log,
                         re.M), log[-2000:]
    _finish(out, cache, reference)  # no lock left against the rerun


@needs_two_cores
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_a_stopped_sweep_saves_every_running_unit_in_one_line_and_resumes(
        tmp_path, cache, reference, sig):
    out = tmp_path / "sweep"
    proc = _start(out, cache)
    workers = _worker_pids(out)
    if sig == signal.SIGINT:  # a Ctrl-C in the terminal: the whole foreground group
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-2].startswith(f"{sig.name}: stopping the running units pretrain-L2-s0, "
                                f"pretrain-L1-s0 after their current step"), err[-3000:]
    stop = re.fullmatch(rf"stopped by {sig.name}: (.+); rerun the same command to resume",
                        lines[-1])
    assert stop, lines[-1]
    units = sorted(stop.group(1).split("; "))  # named as each ends
    assert [re.sub(r"step \d+", "step N", u) for u in units] == [
        "pretrain-L1-s0 (step N saved)", "pretrain-L2-s0 (step N saved)"], lines[-1]
    assert _gone(workers, within=5)
    _finish(out, cache, reference)


@pytest.mark.slow
def test_a_torn_or_damaged_record_is_set_aside_and_its_unit_redone(tmp_path, capsys):
    """A results.jsonl of an earlier version whose last record was cut mid-write (and a
    damaged results/<unit>.json): the rerun moves each aside, keeping its bytes, redoes its
    unit, and ends with every unit's result readable."""
    plan = Plan(size="tiny", depths=(1,), seeds=(0,), tasks=("passivization",),
                pretrain={"run.steps": 4, "run.save_every": 4, "data.batch_size": 8,
                          "data.seq_len": 32, "data.grammar_docs": 300,
                          "optim.warmup_steps": 2},
                finetune={"run.steps": 2, "run.eval_every": 2, "run.save_every": 2,
                          "data.batch_size": 8, "data.seq_len": 128, "task.n_train": 16,
                          "task.n_eval": 4, "task.pack": True})
    out = tmp_path / "sweep"
    Sweep.open(out, plan).run()
    finished = _numbers(out)
    pretrain, finetune = (out / "results" / f"{u}.json" for u in
                          ("pretrain-L1-s0", "finetune-passivization-L1-s0"))
    # as f102334 left it: every row in results.jsonl, the last one torn
    whole, torn = pretrain.read_text(), json.dumps(json.loads(finetune.read_text()))
    fragment = torn[:len(torn) // 2]
    (out / "results.jsonl").write_text(json.dumps(json.loads(whole)) + "\n" + fragment)
    pretrain.unlink()
    finetune.unlink()
    capsys.readouterr()
    Sweep.open(out, None).run()
    err = capsys.readouterr().err
    assert err == (f"warning: {out / 'results.jsonl'}:2: not a whole result record (a write "
                   f"cut short?); moved to {out / 'results.jsonl.unreadable'}, and its unit "
                   f"runs again\n")
    assert (out / "results.jsonl.unreadable").read_text() == f"# results.jsonl:2\n{fragment}\n"
    assert (out / "results.jsonl").read_text() == json.dumps(json.loads(whole)) + "\n"
    assert _numbers(out) == finished and finetune.is_file()

    # a unit's own file damaged (zeroed, as bit rot or a bad copy leaves it)
    size = finetune.stat().st_size
    finetune.write_bytes(b"\0" * size)
    Sweep.open(out, None).run()
    assert "finetune-passivization-L1-s0.json: not a whole result record" in capsys.readouterr().err
    assert Path(f"{finetune}.unreadable").read_bytes() == b"\0" * size
    assert _numbers(out) == finished
    Sweep.open(out, None).run()  # nothing left to set aside, nothing to run
    captured = capsys.readouterr()
    assert captured.err == "" and "all 2 units" in captured.out


def test_a_report_names_the_units_without_a_result(tmp_path, capsys):
    """A sweep mid-way: one line naming what is missing and how to finish it, every cell
    with its number of seeds where it has fewer than its line."""
    plan = Plan(size="tiny", depths=(1, 2), seeds=(0, 1), tasks=("passivization",))
    out = tmp_path / "sweep"
    sweep = Sweep.open(out, plan)
    for d in (1, 2):
        for s in (0, 1):
            sweep.append({"kind": "pretrain", "depth": d, "seed": s, "d_model": 64,
                          "d_ff": 100 * d, "params": 1000, "valid_ppl": 8.0 + d + s,
                          "valid_loss": 2.0, "step": 4})
    for d, s, acc in ((1, 0, 0.25), (1, 1, 0.75), (2, 0, 0.5)):
        sweep.append({"kind": "finetune", "task": "passivization", "depth": d, "seed": s,
                      "init": "final", "init_step": 4, "dev_loss": 0.5, "id_accuracy": acc,
                      "gen_accuracy": acc, "lexical": acc, "structural": 0.0})
    (out / "results" / "pretrain-L2-s1.json").write_text('{"kind": "pretr')  # torn
    capsys.readouterr()
    assert main(["report", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: {out / 'results' / 'pretrain-L2-s1.json'}: not a whole result record (a "
        f"write cut short?); left out",
        f"warning: 2 of 8 units have no result: pretrain-L2-s1, finetune-passivization-L2-s1; "
        f"`python -m jaxdepth.experiments.depth_sweep run --out {out}` finishes them"]
    table = (out / "report" / "table3.md").read_text()
    # depth 1: two seeds everywhere; depth 2: one seed of each, so no interval and no count
    assert "| tiny | 1 | 64 | 100 | 1,000 | 0.640 | 2 | 9.50 ± 6.35 | 50.0 ± 317.7 |" in table
    assert "| tiny | 2 | 64 | 200 | 1,000 | 0.320 | 1 | 10.00 | 50.0 |" in table


def test_a_report_cell_over_fewer_seeds_says_how_many(tmp_path):
    from jaxdepth.analysis.report import table3

    rows = [{"kind": "pretrain", "size_class": "tiny", "depth": 1, "seed": s, "valid_ppl": p,
             "d_model": 64, "d_ff": 256, "params": 10} for s, p in ((0, 8.0), (1, 9.0), (2, 10.0))]
    rows += [{"kind": "finetune", "size_class": "tiny", "task": "t", "depth": 1, "seed": s,
              "init": "final", "gen_accuracy": a, "id_accuracy": 1.0, "dev_loss": 0.1}
             for s, a in ((0, 0.2), (1, 0.4))]
    md, _ = table3(rows)
    # 3 seeds pretrained, 2 fine-tuned: t_{0.975}(1) * s / sqrt(2) = 12.706 * 0.1414 / 1.414
    assert "| 3 | 9.00 ± 2.48 | 30.0 ± 127.1 (n=2) | 100.0 ± 0.0 (n=2) | 0.100 ± 0.000 (n=2) |" in md


def test_an_unknown_unit_is_refused_in_one_line_writing_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    plan = ["--size", "tiny", "--depths", "1", "--seeds", "0", "--tasks", "passivization",
            "--scratch", "none"]
    code = main(["unit", "pretrain-L3-s0", "--out", str(out), *plan, "--sequential"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "config error: unit: plan options belong to `run`/`all`/`plan`; this command reads "
        f"{out}/sweep.json"]
    assert main(["plan", "--out", str(out), *plan]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in out.iterdir())
    code = main(["unit", "pretrain-L3-s0", "--out", str(out), "--sequential"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "config error: unit pretrain-L3-s0: not a unit of this plan (--seeds-per-group 1); its "
        "units: pretrain-L1-s0, finetune-passivization-L1-s0, matched, report"]
    assert sorted(p.name for p in out.iterdir()) == before  # nothing written


def test_a_unit_whose_inputs_are_not_done_waits_with_exit_75(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["plan", "--out", str(out), "--size", "tiny", "--depths", "1", "--seeds",
                 "0", "--tasks", "passivization", "--scratch", "none"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(u["name"], u["after"], u["done"]) for u in plan["units"]] == [
        ("pretrain-L1", [], False), ("finetune-passivization-L1", ["pretrain-L1"], False),
        ("matched", ["pretrain-L1"], False),
        ("report", ["pretrain-L1", "finetune-passivization-L1", "matched"], False)]
    assert plan["units"][1]["command"][1:] == [
        "-m", "jaxdepth.experiments.depth_sweep", "unit", "finetune-passivization-L1", "--out",
        str(out)]
    code = main(["unit", "finetune-passivization-L1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 75 and err == [
        "not ready: unit finetune-passivization-L1 reads pretrain-L1, not done yet; run it "
        "once they are"]


# Sends SIGINT to the process as it starts importing jax (a Ctrl-C during start-up), then runs
# the entry point as its own __main__.
_CTRL_C_AT_JAX = """
import os, signal, sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "jax":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, CtrlC())
"""


@pytest.mark.parametrize("entry", ["depth_sweep", "train.py"])
def test_a_ctrl_c_while_jax_is_imported_is_one_line(tmp_path, entry):
    if entry == "train.py":
        start = (f"import runpy; sys.argv = ['train.py', '--run.dir', {str(tmp_path / 'r')!r}]; "
                 f"runpy.run_path({str(REPO / 'train.py')!r}, run_name='__main__')")
    else:
        start = ("import runpy; sys.argv = ['depth_sweep', 'report', '--out', 'x']; "
                 "runpy.run_module('jaxdepth.experiments.depth_sweep', run_name='__main__', "
                 "alter_sys=True)")
    res = subprocess.run([sys.executable, "-c", _CTRL_C_AT_JAX + start], cwd=REPO,
                         capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert res.returncode == -signal.SIGINT, res.stderr[-3000:]
    assert res.stderr == ("SIGINT: stopped with no training step in progress, so nothing to "
                          "save; rerun the same command to go on\n")
    assert not (tmp_path / "r").exists()
