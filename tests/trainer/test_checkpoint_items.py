"""Issue 23: every item of a checkpoint is fingerprinted (the data iterator's state and the
config as well as the arrays); what a failed run says (non-finite values named, no checkpoint
yet said plainly, run-relative paths); a run that is not learning warns; eval.py prints a
result it cannot write; a failed start-up leaves no empty checkpoints/ behind.

Tiny-L2 runs on one device, in-process, as tests/test_faults.py runs them.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from _train_helpers import committed_steps, step_losses
from test_faults import argv, call, one_line_error

STEPS = 4  # checkpoints at 2 and 4
DATA_FILE = "data/process_0-of-1.json"


def args(run, tokenizer, steps: int = STEPS, **fields) -> list[str]:
    return argv(run, tokenizer, steps, **{"run.save_every": 2, **fields})


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer, train_main):
    """A finished 4-step run (checkpoints 2 and 4) and the loss of each of its steps."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert train_main([str(a) for a in args(run, tokenizer)]) == 0
    assert committed_steps(run) == [2, 4]
    return run, {s: v[0] for s, v in step_losses(run).items()}


def copy_run(finished, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    return run


def record(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / str(step) / "fingerprints" / "metadata").read_text())


# ----------------------------------------------------------------------------- item 1

def test_the_data_state_and_config_are_fingerprinted(finished):
    run = finished[0]
    for step in (2, 4):
        saved = record(run, step)
        data = (run / "checkpoints" / str(step) / DATA_FILE).read_bytes()
        assert json.loads(data) == {"next_index": step}
        assert saved[DATA_FILE] == hashlib.sha256(data).hexdigest()
        config = json.loads((run / "checkpoints" / str(step) / "config" / "metadata").read_text())
        assert saved["config"] == hashlib.sha256(
            json.dumps(config, sort_keys=True).encode()).hexdigest()


def _flip_data_state(step_dir: Path) -> None:
    """'"next_index": 4' -> '"next_index": 5': one flipped bit (0x34 -> 0x35)."""
    path = step_dir / DATA_FILE
    text = path.read_text()
    assert '"next_index": 4' in text
    path.write_text(text.replace('"next_index": 4', '"next_index": 5'))


def _flip_config(step_dir: Path) -> None:
    """'"d_model": 64' -> '"d_model": 66': one flipped bit (0x34 -> 0x36)."""
    path = step_dir / "config" / "metadata"
    text = path.read_text()
    assert text.count('"d_model": 64') == 1
    path.write_text(text.replace('"d_model": 64', '"d_model": 66'))


@pytest.mark.parametrize("flip, why", [
    (_flip_data_state, f"the data iterator state in {DATA_FILE} differs from the fingerprint "
                       f"saved with it"),
    (_flip_config, "its config differs from the fingerprint saved with it"),
], ids=["data_state", "config"])
def test_a_flipped_bit_in_the_data_state_or_config_makes_the_checkpoint_unreadable(
        finished, tmp_path, tokenizer, train_main, capsys, flip, why):
    run = copy_run(finished, tmp_path)
    flip(run / "checkpoints" / "4")
    code, out, err = call(train_main, args(run, tokenizer), capsys)
    assert code == 0, err[-3000:]
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: checkpoint 4 in {run / 'checkpoints'} is unreadable ({why}); "
                        f"moved to {run / 'checkpoints-corrupt' / '4'}; resuming from step 2"]
    # steps 3 and 4 were trained again from step 2's checkpoint, as they were the first time
    again = step_losses(run)
    assert {s: v[-1] for s, v in again.items()} == finished[1]
    assert len(again[3]) == len(again[4]) == 2
    assert committed_steps(run) == [2, 4]


def test_a_checkpoint_without_the_new_fingerprints_is_taken_as_before(
        finished, tmp_path, tokenizer, train_main, capsys):
    run = copy_run(finished, tmp_path)
    path = run / "checkpoints" / "4" / "fingerprints" / "metadata"
    path.write_text(json.dumps({k: v for k, v in record(run, 4).items()
                                if k not in (DATA_FILE, "config")}))
    _flip_data_state(run / "checkpoints" / "4")  # nothing to check it against
    code, out, err = call(train_main, args(run, tokenizer, 5), capsys)
    assert code == 0, err[-3000:]
    assert "warning" not in err and committed_steps(run) == [2, 4, 5]
    assert "finished step 5" in out
    # the checkpoint written after it has the whole record: a skipped batch shows in it
    data = (run / "checkpoints" / "5" / DATA_FILE).read_bytes()
    assert json.loads(data) == {"next_index": 6}
    assert record(run, 5)[DATA_FILE] == hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- item 13

@pytest.fixture
def forced_metrics(monkeypatch):
    """forced_metrics(step -> {metric: value}) makes the train step report those values (the
    state is trained as ever); returns the metrics each step really had, by step."""
    from jaxdepth.trainer.trials import Trials

    real, seen = Trials.make_step, {}

    def force(forced):
        def make_step(self, *a, **k):
            fn = real(self, *a, **k)

            def step(state, batch):  # a run of one: [1] arrays
                state, m = fn(state, batch)
                s = int(state.step[0])
                seen[s] = {k: float(v[0]) for k, v in m.items()}
                return state, {**m, **{k: jnp.full(1, v, jnp.float32)
                                       for k, v in forced(s).items()}}
            return step

        monkeypatch.setattr(Trials, "make_step", make_step)
        return seen
    return force


def test_a_non_finite_gradient_norm_is_named_with_the_finite_values(
        tmp_path, tokenizer, train_main, capsys, forced_metrics):
    seen = forced_metrics(lambda s: {"grad_norm": math.inf} if s == 3 else {})
    run = tmp_path / "run"
    code, _, err = call(train_main, args(run, tokenizer), capsys)
    line = one_line_error(err, code, want=1)
    assert line == (f"error: non-finite gradient norm (inf) at step 3 (finite: loss "
                    f"{seen[3]['loss']}, parameter norm after the update {seen[3]['param_norm']}"
                    f"); stopping. The last good checkpoint (step 2) in {run / 'checkpoints'} "
                    f"is intact.")
    assert committed_steps(run) == [2]


def test_no_checkpoint_yet_is_said_plainly(tmp_path, tokenizer, train_main, capsys,
                                           forced_metrics):
    seen = forced_metrics(lambda s: {"loss": math.nan, "param_norm": math.inf} if s == 1 else {})
    run = tmp_path / "run"
    code, _, err = call(train_main, args(run, tokenizer), capsys)
    line = one_line_error(err, code, want=1)
    assert line == (f"error: non-finite loss (nan) and parameter norm after the update (inf) at "
                    f"step 1 (finite: gradient norm {seen[1]['grad_norm']}); stopping. No "
                    f"checkpoint was saved yet.")
    assert not (run / "checkpoints").exists()  # nothing saved: no empty directory left


# ----------------------------------------------------------------------------- item 14

def test_a_run_that_is_not_learning_warns_once(tmp_path, tokenizer, train_main, capsys,
                                               forced_metrics):
    # The gradient norm is 0 on every step but step 20: 19 in a row do not warn, steps 21-40
    # do. The loss sits at ln V on every step; the 2 warm-up steps do not count.
    forced_metrics(lambda s: {"loss": math.log(512), **({"grad_norm": 0.0} if s != 20 else {})})
    run = tmp_path / "run"
    code, out, err = call(train_main, args(run, tokenizer, 45, **{
        "optim.warmup_steps": 2, "run.save_every": 45}), capsys)
    assert code == 0, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("warning:")] == [
        "warning: the loss has stayed at ln(vocab_size) = ln 512 = 6.2383 (uniform predictions) "
        "for 20 steps in a row after warm-up (steps 3-22): the run is not learning",
        "warning: the gradient norm has been exactly 0 for 20 steps in a row (steps 21-40): the "
        "parameters get no gradient; the run is not learning"]


# ----------------------------------------------------------------------------- item 11

def test_eval_prints_a_result_it_cannot_write(finished, tmp_path, eval_main, capsys):
    run = finished[0]
    good = tmp_path / "ppl.json"
    code, out, err = call(eval_main, ["--run", run, "--out", good], capsys)
    assert code == 0, err[-3000:]
    result = json.loads(out)
    assert json.loads(good.read_text()) == result and result["step"] == STEPS

    bad = tmp_path / "missing" / "ppl.json"
    code, out, err = call(eval_main, ["--run", run, "--out", bad], capsys)
    line = one_line_error(err, code)
    assert line == (f"error: could not write the result to {bad} (no such file or directory); "
                    f"it is printed above; give --out a writable path to keep it in a file")
    assert json.loads(out) == result


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to a read-only directory")
def test_eval_on_a_read_only_run_directory(finished, tmp_path, eval_main, capsys):
    run = copy_run(finished, tmp_path)
    run.chmod(0o555)
    try:
        code, out, err = call(eval_main, ["--run", run], capsys)
    finally:
        run.chmod(0o755)
    line = one_line_error(err, code)
    assert line == (f"error: could not write the result to {run / 'eval_step4.json'} "
                    f"(permission denied); it is printed above; give --out a writable path to "
                    f"keep it in a file")
    assert json.loads(out)["step"] == STEPS


# ----------------------------------------------------------------------------- smaller items

def test_a_failed_start_leaves_no_empty_checkpoints_directory(tmp_path, tokenizer, train_main,
                                                              capsys):
    run = tmp_path / "run"
    missing = tmp_path / "missing.txt"
    code, _, err = call(train_main, args(run, "", **{"data.corpus": missing}), capsys)
    one_line_error(err, code, str(missing))
    assert run.is_dir() and not (run / "checkpoints").exists()


def test_messages_name_the_run_directory_as_given(finished, tmp_path, tokenizer, train_main,
                                                  capsys, monkeypatch):
    run = copy_run(finished, tmp_path)
    for step in (2, 4):
        shutil.rmtree(run / "checkpoints" / str(step) / "state")
    monkeypatch.chdir(tmp_path)
    code, _, err = call(train_main, args("run", tokenizer), capsys)
    line = one_line_error(err, code)
    assert re.fullmatch(r"error: no readable checkpoint in run/checkpoints \(step 4: .*; step 2: "
                        r".*\); move run/checkpoints aside \(or give another --run.dir\) to "
                        r"start afresh", line), line


def test_a_failed_save_names_the_checkpoint_as_given(tmp_path):
    from jaxdepth.trainer import checkpoint as ckpt

    class FailedSave:  # a CheckpointManager whose save of step 4 met a full disk
        directory = tmp_path.absolute() / "run" / "checkpoints"

        def wait_until_finished(self):
            raise OSError(28, "No space left on device")

        def all_steps(self):
            return [2, 4]

    with pytest.raises(ckpt.CheckpointSaveFailed) as e:
        ckpt.check_saves(FailedSave(), 4, 5, wait=True, where=Path("run") / "checkpoints")
    assert str(e.value) == (
        "no space left on device while saving step 4 to run/checkpoints/4; training stopped at "
        "step 5; the checkpoint of step 2 is intact: fix the disk (space, permissions) and rerun "
        "the same command to resume from it")


def test_a_fresh_run_whose_loss_hardly_moves_warns_once(tmp_path, tokenizer, train_main,
                                                        capsys):
    """At lr 1e-12 a fresh model's loss stays where it started (issue 35: 6.78 -> 6.77 over 60
    steps): no NaN, a gradient, a loss above ln V, so neither detector above sees it. The mean
    over the 10 steps after warm-up is compared with the mean over the first 10; the same run
    at its recipe's learning rate does not warn."""
    def warnings(lr: float) -> list[str]:
        run = tmp_path / f"lr{lr}"
        code, out, err = call(train_main, args(run, tokenizer, 20, **{
            "optim.lr": lr, "optim.warmup_steps": 2, "run.save_every": 20}), capsys)
        assert code == 0, err[-3000:]
        return [line for line in err.splitlines() if line.startswith("warning:")]

    got = warnings(1e-12)
    losses = {s: v[0] for s, v in step_losses(tmp_path / "lr1e-12").items()}
    before = float(np.mean([losses[s] for s in range(1, 11)]))
    after = float(np.mean([losses[s] for s in range(11, 21)]))
    assert abs(before - after) < 1e-3 * before  # the loss did not move
    assert got == [
        f"warning: the mean loss over steps 11-20, after warm-up, is {after:.4f}, "
        f"{100 * (before - after) / before:.2f}% below its mean over steps 1-10 "
        f"({before:.4f}): a model trained from fresh weights should have moved further; the "
        f"run is hardly learning (optim.lr 1e-12?)"]
    assert warnings(0.06) == []
    # trials: each is watched with its own settings, and the warning names the one stuck
    run = tmp_path / "trials"
    code, out, err = call(train_main, args(run, tokenizer, 20, **{
        "trials.lr": "1e-12,0.06", "optim.warmup_steps": 2, "run.save_every": 20}), capsys)
    assert code == 0, err[-3000:]
    got = [line for line in err.splitlines() if line.startswith("warning:")]
    assert got == [f"warning: trial 0 (run.seed=0, optim.lr=1e-12): the mean loss over steps "
                   f"11-20, after warm-up, is {after:.4f}, {100 * (before - after) / before:.2f}"
                   f"% below its mean over steps 1-10 ({before:.4f}): a model trained from "
                   f"fresh weights should have moved further; the run is hardly learning "
                   f"(optim.lr 1e-12?)"]


def test_throughput_is_measured_over_training_time_only(tmp_path, tokenizer, train_main, capsys):
    """Every step logged and an evaluation every 3 steps: each record's tokens_per_s covers
    the steps since the one before, the evaluation's time taken out and the step in flight when
    it began kept in (issue 35: its wait was taken out too, and the next record read MFU 8.35)."""
    run = tmp_path / "run"
    code, _, err = call(train_main, args(run, tokenizer, 12, **{
        "run.eval_every": 3, "run.save_every": 12}), capsys)
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r for r in records if "tokens_per_s" in r}
    assert sorted(rates) == list(range(2, 13))
    for step, r in rates.items():
        assert 0 < r["mfu"] < 1, (step, r)
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * summary["flops_per_token"]
                                         / summary["peak_flops"])
