"""The depth sweep end to end on a two-depth tiny plan: rows agree with the runs' own files,
matched checkpoints and equal-loss points agree with an independent reading of the logs,
reruns add nothing, and another plan for the same directory is refused."""
import json

import jax
import pytest

from jaxdepth.config import ConfigError
from jaxdepth.models.depth_family import depth_family, param_count
from jaxdepth.experiments.depth_sweep import Plan, Sweep, main, parse, plan_from_args
from jaxdepth.trainer.checkpoint import open_manager

PLAN = Plan(
    size="tiny", depths=(1, 2), seeds=(0,), tasks=("passivization",),
    pretrain={"run.steps": 12, "run.save_every": 4, "data.batch_size": 8, "data.seq_len": 32,
              "data.grammar_docs": 1500, "optim.warmup_steps": 2},
    finetune={"run.steps": 6, "run.eval_every": 2, "run.save_every": 6, "data.batch_size": 8,
              "data.seq_len": 128, "optim.name": "adamw", "optim.lr": 3e-3,
              "task.n_train": 32, "task.n_eval": 4, "task.pack": True},
    scratch=(1,),
)


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _results(out):
    """The sweep's rows, one file per finished unit."""
    return [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]


@pytest.mark.slow
def test_sweep_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    sweep = Sweep.open(out, PLAN)
    before = jax.config.jax_compilation_cache_dir
    sweep.run()
    # the units' programs in the experiment's one cache, and the process's own setting back
    assert len(list((out / "jax_cache").iterdir())) >= 4
    assert jax.config.jax_compilation_cache_dir == before != str(out / "jax_cache")
    rows = _results(out)
    family = depth_family("tiny")
    pre = {r["depth"]: r for r in rows if r["kind"] == "pretrain"}
    assert sorted(pre) == [1, 2]
    for d, r in pre.items():
        summary = json.loads((out / "pretrain" / f"L{d}-s0" / "summary.json").read_text())
        assert r["valid_ppl"] == summary["valid_ppl"] and r["step"] == 12
        assert r["d_ff"] == family[d].d_ff and r["params"] == param_count(family[d])
    ft = {r["depth"]: r for r in rows if r["kind"] == "finetune" and r["init"] == "final"}
    assert sorted(ft) == [1, 2]
    for d, r in ft.items():
        summary = json.loads((out / "finetune" / "passivization" / f"L{d}-s0" / "summary.json").read_text())
        assert r["gen_accuracy"] == summary["gen_accuracy"] and r["init_step"] == 12
        assert r["dev_loss"] == summary["dev_loss"]

    # the from-scratch control: fresh weights, the pretrained run's tokenizer, the same recipe
    scratch = [r for r in rows if r["kind"] == "finetune" and r["init"] == "scratch"]
    assert [(r["depth"], r["seed"], r["init_step"]) for r in scratch] == [(1, 0, None)]
    run = out / "finetune" / "passivization" / "L1-s0-scratch"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["task"]["init_from"] == "" and cfg["task"]["pack"] is True
    assert ((run / "data" / "tokenizer.model").read_bytes()
            == (out / "pretrain" / "L1-s0" / "data" / "tokenizer.model").read_bytes())

    # matched: first saved checkpoint whose logged perplexity is <= L1's final one
    sweep.matched()
    ref = pre[1]["valid_ppl"]
    logged = {r["step"]: r["valid_ppl"] for r in _jsonl(out / "pretrain" / "L2-s0" / "metrics.jsonl")
              if "valid_ppl" in r}
    mngr = open_manager(out / "pretrain" / "L2-s0", read_only=True)
    saved = sorted(mngr.all_steps())
    mngr.close()
    assert saved == [4, 8, 12]  # every checkpoint kept, each with a validation perplexity
    want = next((s for s in saved if logged[s] <= ref), None)
    matched = {r["depth"]: r for r in _results(out)
               if r["kind"] == "finetune" and r["init"] == "matched"}
    assert matched[1]["init_step"] == 12
    if want is None:
        assert 2 not in matched
    else:
        assert matched[2]["init_step"] == want

    # equal loss: the common threshold is the lowest dev loss both runs reach
    sweep.equal_loss()
    curves = {d: [(e["step"], e["dev_loss"]) for e in
                  _jsonl(out / "finetune" / "passivization" / f"L{d}-s0" / "evals.jsonl")]
              for d in (1, 2)}
    threshold = max(min(v for _, v in c) for c in curves.values())
    eq = {r["depth"]: r for r in _results(out) if r["kind"] == "equal_loss"}
    for d, c in curves.items():
        assert eq[d]["threshold"] == pytest.approx(threshold)
        assert eq[d]["step"] == next(s for s, v in c if v <= threshold)

    paths = sweep.rank()
    by_depth = (out / "analysis" / "ff_rank_by_depth.csv").read_text().splitlines()
    assert len(by_depth) == 1 + 2 * 3 and str(paths["csv"]).endswith("ff_rank_by_depth.csv")
    report = sweep.report()
    table = (out / "report" / "table3.md").read_text()
    for d in (1, 2):  # one line per depth: Eq. 1 width, parameters and the pretrain perplexity
        assert (f"| tiny | {d} | 64 | {family[d].d_ff} | {param_count(family[d]):,} |" in table
                and f"| {pre[d]['valid_ppl']:.2f} |" in table)
    assert any(str(p).endswith(".png") for p in report.values())
    assert "fresh weights" in (out / "report" / "table3_scratch.md").read_text()

    # reruns are no-ops; another plan for the same directory is refused
    n = len(_results(out))
    capsys.readouterr()
    assert main(["run", "--out", str(out)]) == 0
    assert len(_results(out)) == n
    # 2 pretrainings, 2 fine-tunings and 1 control: said, not silent
    assert f"all 5 units of {out} are done" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="seeds"):
        Sweep.open(out, Plan(**{**PLAN.to_json(), "seeds": (0, 1)}))


def test_a_resumed_finetuning_unit_records_the_step_it_started_from(tmp_path, monkeypatch):
    """A fine-tuning unit interrupted and resumed restores its own checkpoint and never reads
    the pretrained one again: its row still names the pretrained step it started from, as
    the uninterrupted unit's does (null was written)."""
    from jaxdepth.config import apply_overrides
    from jaxdepth.errors import RunFailed

    plan = Plan(**{**PLAN.to_json(), "depths": (1,), "scratch": (),
                   "pretrain": {**PLAN.pretrain, "run.steps": 4, "data.grammar_docs": 300},
                   "finetune": {**PLAN.finetune, "run.steps": 4, "run.save_every": 2}})
    out = tmp_path / "sweep"
    whole = Sweep.finetune_config

    def stopping(self, *a, **k):  # the first start stops after 2 of its 4 steps
        return apply_overrides(whole(self, *a, **k), {"run": {"stop_after": 2}})

    monkeypatch.setattr(Sweep, "finetune_config", stopping)
    with pytest.raises(RunFailed, match="stopped at step 2"):
        Sweep.open(out, plan).run()
    monkeypatch.setattr(Sweep, "finetune_config", whole)
    Sweep.open(out, None).run()  # resumes the unit from its step 2
    rows = _results(out)
    assert sorted((r["kind"], r["step"] if r["kind"] == "pretrain" else r["init_step"])
                  for r in rows) == [("finetune", 4), ("pretrain", 4)]


def test_a_sweep_on_a_directory_in_use_is_one_line(tmp_path, capsys):
    """A second sweep on the same --out meets the first one's run lock: one line, exit 2,
    whose advice names the sweep's own flag (--out), not train.py's --run.dir."""
    import os
    from jaxdepth.trainer.run_lock import run_lock
    out = tmp_path / "sweep"
    argv = ["run", "--out", str(out), "--size", "tiny", "--depths", "1", "--seeds", "0",
            "--tasks", "passivization", "--scratch", "none"]
    run = out / "pretrain" / "L1-s0"
    with run_lock(run):
        assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {run} is in use by process {os.getpid()} (lock {run / '.lock'}); "
                   f"wait for it to finish, or give this experiment another --out"]


def test_executor_flags_belong_to_their_executor():
    from jaxdepth.experiments.executors import executor_from_args
    for extra, want in (
            (["--gpus-per-unit", "1"], "--gpus-per-unit: the ray executor's; the local executor "
                                       "runs units on this machine's devices"),
            (["--executor", "slurm", "--gpus-per-unit", "8"],
             "--gpus-per-unit: the ray executor's; give the slurm executor --slurm "
             "gpus_per_node=8"),
            (["--executor", "ray", "--workers", "2"], "--workers: the local executor's")):
        with pytest.raises(ConfigError) as e:
            executor_from_args(parse(["run", "--out", "x", *extra]))
        assert str(e.value).startswith(want), str(e.value)


def test_plan_validation():
    with pytest.raises(ConfigError, match="depths"):
        Plan(size="tiny", depths=(5,))
    with pytest.raises(ConfigError, match="tasks"):
        Plan(tasks=("scan",))
    # a control needs the pretraining run of its depth (its tokenizer comes from there)
    with pytest.raises(ConfigError, match=r"scratch: \[4\] not among the depths"):
        plan_from_args(parse(["run", "--out", "x", "--preset", "miniature", "--depths", "1,2"]))
    args = parse(["run", "--out", "x", "--preset", "miniature", "--depths", "1,2", "--scratch", "2"])
    assert plan_from_args(args).scratch == (2,)
    args = parse(["run", "--out", "x", "--preset", "miniature", "--scratch", "none"])
    assert plan_from_args(args).scratch == ()
    with pytest.raises(FileNotFoundError, match="sweep.json"):
        Sweep.open(__import__("pathlib").Path("/nonexistent-sweep"), None)
    # 45 seeds are given as a range; a bad one names the flag
    args = parse(["run", "--out", "x", "--preset", "miniature", "--seeds", "0-44"])
    assert plan_from_args(args).seeds == tuple(range(45))
    args = parse(["run", "--out", "x", "--preset", "miniature", "--seeds", "0-2,7"])
    assert plan_from_args(args).seeds == (0, 1, 2, 7)
    with pytest.raises(ConfigError, match="--seeds: '4-2'"):
        plan_from_args(parse(["run", "--out", "x", "--seeds", "4-2"]))
    # the English plan pretrains only, on the corpus the user names, and never on the grammar
    with pytest.raises(ConfigError, match="--pretrain data.corpus"):
        plan_from_args(parse(["run", "--out", "x", "--preset", "english"]))
    plan = plan_from_args(parse(["run", "--out", "x", "--preset", "english", "--size", "small",
                                 "--pretrain", "data.corpus=a.txt"]))
    assert (plan.size, plan.tasks, plan.pretrain["data.corpus"]) == ("small", (), "a.txt")
