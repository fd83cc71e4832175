"""depth_sweep --workers: the groups of a stage trained at once in processes of their own
(experiments/workers.py), each on a core of its own with --pin, give the rows one process
gives up to the last bits; a failing group ends the command in one line naming it and its
log."""
import json
import os
import subprocess
import sys

import pytest

from jaxdepth.experiments.depth_sweep import Plan, Sweep, main

PLAN = ["--size", "tiny", "--depths", "1,2", "--seeds", "0", "--tasks", "passivization",
        "--scratch", "none", "--pretrain", "run.steps=6", "--pretrain", "run.save_every=6",
        "--pretrain", "data.batch_size=8", "--pretrain", "data.seq_len=32",
        "--pretrain", "data.grammar_docs=600", "--pretrain", "optim.warmup_steps=2",
        "--finetune", "run.steps=4", "--finetune", "run.eval_every=4",
        "--finetune", "run.save_every=4", "--finetune", "data.batch_size=8",
        "--finetune", "data.seq_len=128", "--finetune", "task.n_train=16",
        "--finetune", "task.n_eval=4", "--finetune", "task.pack=true"]


def _rows(out):
    rows = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    return {(r["kind"], r["depth"]): r for r in rows}


@pytest.mark.slow
def test_two_workers_give_the_rows_of_one_process(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path / "one"), *PLAN]) == 0
    assert main(["run", "--out", str(tmp_path / "two"), "--workers", "2", "--sequential",
                 *PLAN]) == 0
    printed = capsys.readouterr().out
    for group in ("pretrain-L1-s0", "pretrain-L2-s0", "finetune-passivization-L1-s0",
                  "finetune-passivization-L2-s0"):
        assert f"{group}: done in" in printed
        assert (tmp_path / "two" / "logs" / f"{group}.log").is_file()
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert sorted(one) == sorted(two) == [("finetune", 1), ("finetune", 2),
                                          ("pretrain", 1), ("pretrain", 2)]
    for key in one:
        loss = "valid_loss" if key[0] == "pretrain" else "dev_loss"
        # XLA's Eigen ops on one thread in a worker: the same run but for the last bits
        assert two[key][loss] == pytest.approx(one[key][loss], rel=1e-4), key
    # a rerun finds every unit done and starts no worker
    assert main(["run", "--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    assert "nothing to run" in capsys.readouterr().out


def test_the_units_are_groups_of_seeds_deepest_first_then_the_analyses(tmp_path):
    plan = Plan(size="tiny", depths=(1, 2, 4), seeds=(0, 1, 2), tasks=("passivization",),
                scratch=(4,), matched=False)
    sweep = Sweep.open(tmp_path / "s", plan)
    units = sweep.schedule()
    assert [(u.name, u.after) for u in units[:7]] == [
        ("pretrain-L4", ()), ("pretrain-L2", ()), ("pretrain-L1", ()),
        ("finetune-passivization-L4", ("pretrain-L4",)),
        ("finetune-passivization-L4-scratch", ("pretrain-L4",)),
        ("finetune-passivization-L2", ("pretrain-L2",)),
        ("finetune-passivization-L1", ("pretrain-L1",))]
    assert units[7].name == "report" and units[7].analysis
    assert units[7].after == tuple(u.name for u in units[:7])
    assert units[0].trains == "pretraining of tiny-L4, seeds 0, 1, 2"
    sweep.per_group = 1  # seed by seed (--sequential): a seed's units finish together
    units = sweep.schedule()
    assert [(u.name, u.after) for u in units[:7]] == [
        ("pretrain-L4-s0", ()), ("pretrain-L2-s0", ()), ("pretrain-L1-s0", ()),
        ("finetune-passivization-L4-s0", ("pretrain-L4-s0",)),
        ("finetune-passivization-L4-s0-scratch", ("pretrain-L4-s0",)),
        ("finetune-passivization-L2-s0", ("pretrain-L2-s0",)),
        ("finetune-passivization-L1-s0", ("pretrain-L1-s0",))]
    assert [u.name for u in units[7:14]] == [u.name.replace("-s0", "-s1") for u in units[:7]]
    sweep.per_group = 2  # two seeds a program, the last group the rest
    assert [u.name for u in sweep.schedule() if u.name.startswith("pretrain-L4")] == [
        "pretrain-L4-seeds-0-1", "pretrain-L4-seeds-2"]
    # the results each training unit writes: every seed's, in the order they start
    assert sweep.units()[:3] == ["pretrain-L4-s0", "pretrain-L4-s1", "pretrain-L2-s0"]
    # each unit trains only its own seeds
    calls = []
    sweep.pretrain_seeds = lambda depth, seeds: calls.append((depth, seeds))
    next(u for u in sweep.schedule() if u.name == "pretrain-L2-seeds-2").run()
    assert calls == [(2, [2])]


def test_a_group_starts_once_the_groups_it_needs_are_done(tmp_path, monkeypatch):
    from jaxdepth.experiments import workers

    started, polls = [], {}

    class Worker:
        returncode = 0

        def __init__(self, name):
            self.name = name

        def poll(self):  # a pretraining runs for 3 polls, a fine-tuning for 1
            polls[self.name] = polls.get(self.name, 0) + 1
            return 0 if polls[self.name] > (3 if self.name.startswith("pre") else 1) else None

    def start(out, name, command, cpu):
        started.append(name)
        return Worker(name), tmp_path / f"{name}.log"

    monkeypatch.setattr(workers, "_start", start)
    monkeypatch.setattr(workers.time, "sleep", lambda s: None)
    workers.run_groups(tmp_path, [("pre-a", ()), ("fine-a1", ("pre-a",)), ("fine-a2", ("pre-a",)),
                                  ("pre-b", ()), ("fine-b1", ("pre-b",))], 2, False,
                       lambda name: [name])
    # fine-a1 waits for pre-a: the second worker takes pre-b, the first ready in order
    assert started == ["pre-a", "pre-b", "fine-a1", "fine-a2", "fine-b1"]


@pytest.mark.slow
def test_a_failing_group_is_one_line_naming_it_and_its_log(tmp_path, capsys):
    missing = tmp_path / "no-such-corpus.txt"
    code = main(["run", "--out", str(tmp_path / "s"), "--workers", "2", "--pin", *PLAN,
                 "--pretrain", f"data.corpus={missing}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert "pretrain-L1 (exit 2" in err[0] and "pretrain-L2 (exit 2" in err[0]
    assert str(missing) in err[0] and "logs/pretrain-L1.log" in err[0]
    assert not (tmp_path / "s" / "logs" / "finetune-passivization-L1.log").exists()


def test_workers_are_refused_on_an_accelerator(tmp_path, monkeypatch, capsys):
    import jax
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    code = main(["run", "--out", str(tmp_path / "s"), "--workers", "2", *PLAN])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--workers 2: the groups would share one gpu device" in err[0]
    assert not (tmp_path / "s").exists()


def test_the_english_plan_without_a_corpus_is_one_line_and_writes_nothing(tmp_path, capsys):
    code = main(["all", "--out", str(tmp_path / "e"), "--preset", "english"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--pretrain data.corpus" in err[0]
    assert not (tmp_path / "e").exists()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning is Linux's, and shows only with two cores or more")
def test_a_worker_keeps_to_the_core_its_parent_gave_it():
    from jaxdepth.experiments import workers

    cpu = max(os.sched_getaffinity(0))
    code = ("from jaxdepth.experiments.workers import as_worker; import os; as_worker(); "
            "print(sorted(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, workers.CPU_ENV: str(cpu)}).stdout
    assert out.strip() == f"[{cpu}]"


def test_workers_running_at_once_get_different_cores(tmp_path, monkeypatch):
    from jaxdepth.experiments import workers

    monkeypatch.setattr(workers, "_cores", lambda n: [5, 7][:n])
    started, live = [], set()

    lasts = {"a": 4, "b": 1, "c": 1, "d": 1}  # polls each worker runs: b ends before a

    class Worker:  # ends after its polls, giving its core back
        returncode = 0

        def __init__(self, name, cpu):
            self.name, self.cpu, self.polls = name, cpu, 0

        def poll(self):
            self.polls += 1
            if self.polls <= lasts[self.name]:
                return None
            live.discard(self.cpu)
            return 0

    def start(out, name, command, cpu):
        assert cpu is None or cpu not in live  # never two pinned at once on one core
        live.add(cpu)
        started.append((name, cpu))
        return Worker(name, cpu), tmp_path / f"{name}.log"

    monkeypatch.setattr(workers, "_start", start)
    monkeypatch.setattr(workers.time, "sleep", lambda s: None)
    workers.run_groups(tmp_path, [(name, ()) for name in "abcd"], 2, True, lambda n: [n])
    # c and d take the core b gave back while a still holds its own
    assert started == [("a", 5), ("b", 7), ("c", 7), ("d", 7)]
    started.clear()  # unpinned: no core named, so the workers share them all
    workers.run_groups(tmp_path, [(name, ()) for name in "abc"], 2, False, lambda n: [n])
    assert [cpu for _, cpu in started] == [None, None, None]


def test_pin_without_workers_is_one_line_and_writes_nothing(tmp_path, capsys):
    code = main(["run", "--out", str(tmp_path / "s"), "--pin", *PLAN])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--pin" in err[0] and "--workers 2" in err[0]
    assert not (tmp_path / "s").exists()


def test_a_pinned_worker_is_started_with_its_core_and_an_unpinned_one_without(tmp_path,
                                                                              monkeypatch):
    from jaxdepth.experiments import workers

    envs = []
    monkeypatch.setattr(workers.subprocess, "Popen",
                        lambda cmd, env, **kw: envs.append(env) or object())
    monkeypatch.setenv(workers.CPU_ENV, "3")  # from a parent that was itself a worker
    workers._start(tmp_path, "g", ["python"], 1)
    workers._start(tmp_path, "g", ["python"], None)
    assert envs[0][workers.CPU_ENV] == "1" and workers.CPU_ENV not in envs[1]
    assert workers.ONE_THREAD in envs[1]["XLA_FLAGS"]


def test_a_unit_s_process_pins_itself_before_the_unit_runs(tmp_path, monkeypatch):
    from jaxdepth.experiments import workers

    order = []
    assert main(["plan", "--out", str(tmp_path / "s"), *PLAN]) == 0
    monkeypatch.setattr(workers, "as_worker", lambda: order.append("pin"))
    monkeypatch.setattr(Sweep, "run_unit", lambda self, name: order.append(f"run {name}"))
    assert main(["unit", "pretrain-L1", "--out", str(tmp_path / "s")]) == 0
    assert order == ["pin", "run pretrain-L1"]


def test_more_pinned_workers_than_cores_is_one_line(tmp_path, capsys):
    n = len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else 2
    code = main(["run", "--out", str(tmp_path / "s"), "--workers", str(n), "--pin", *PLAN])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--pin" in err[0]
    assert not (tmp_path / "s").exists()
