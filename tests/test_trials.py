"""Trials (jaxdepth/trainer/trials.py): K runs that share every array shape, trained side by
side as one compiled program, each equal to the solo run its own config describes.

Every number is checked against an independent reference: the solo run of the trial's
settings (its losses, evaluations, exported checkpoint and eval.py result), an uninterrupted
run (resume), the same trials on one device (sharding). Runs are tiny (tiny-L2 on the
embedded grammar, batches of 8, one device unless the test is about sharding), in-process,
shared between tests through a module-level cache, and compiled once per program through a
persistent compilation cache.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from _train_helpers import base_args, read_metrics
from jaxdepth.cli import parse_args
from jaxdepth.config import ConfigError, trial_configs, trial_grid

STEPS = 8  # evaluations at 4 and 8, checkpoints at 4 and 8
LR_B = 0.03  # the recipe's lr is 0.06
RTOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
    """The runs of this module share a persistent compilation cache: a program that several
    runs compile (the solo step of two seeds, the trials' step of a resumed run) compiles
    once (the previous settings come back afterwards)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {n: getattr(jax.config, n) for n in names}
    jax.config.update(names[0], str(tmp_path_factory.mktemp("jit_cache")))
    jax.config.update(names[1], 0)
    cc.reset_cache()
    yield
    for n, v in before.items():
        jax.config.update(n, v)
    cc.reset_cache()


def lm_args(run, tokenizer, steps: int = STEPS, **fields) -> list[str]:
    """A tiny-L2 run on one device: every step logged, evaluations and checkpoints at 4, 8."""
    more = {"mesh.data": 1, "run.eval_every": 4, "run.save_every": 4,
            "run.grammar_samples": 0, **fields}
    return [str(a) for a in base_args(run, tokenizer, steps, **more)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory, tokenizer, train_main):
    """lm(name, steps=STEPS, **fields) -> the directory of a finished run of lm_args; each
    distinct run is trained once per module (tests share them)."""
    done: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("lm")

    def get(name: str, steps: int = STEPS, **fields) -> Path:
        if name not in done:
            run = root / name
            assert train_main(lm_args(run, tokenizer, steps, **fields)) == 0
            done[name] = run
        return done[name]

    return get


# ----------------------------------------------------------------------------- reading runs

def train_records(run, trial: int | None = None) -> dict[int, dict]:
    """step -> the training record of that trial (None: a run without trials), each step
    logged exactly once."""
    out: dict[int, dict] = {}
    for r in read_metrics(run):
        if "grad_norm" in r and r.get("trial") == trial:
            assert r["step"] not in out, f"step {r['step']} of trial {trial} logged twice"
            out[r["step"]] = r
    return out


def losses(run, trial: int | None = None, steps: int = STEPS) -> np.ndarray:
    recs = train_records(run, trial)
    assert sorted(recs) == list(range(1, steps + 1)), sorted(recs)
    return np.array([recs[s]["loss"] for s in range(1, steps + 1)])


def evals(run, trial: int | None = None, key: str = "valid_loss") -> dict[int, float]:
    """step -> the evaluation's `key` of that trial."""
    return {r["step"]: r[key] for r in read_metrics(run) if key in r and r.get("trial") == trial}


def summary(run) -> dict:
    return json.loads((Path(run) / "summary.json").read_text())


def close(got, want, what: str = "") -> None:
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=0, err_msg=what)


def same_evals(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want) and got, (got, want)
    close([got[s] for s in sorted(got)], [want[s] for s in sorted(want)])


def call(main, args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def t_half_width(values) -> float:
    """Half-width of the 95% t interval of the mean (table values: df 1..3)."""
    t = {1: 12.706204736, 2: 4.30265273, 3: 3.182446305}[len(values) - 1]
    return t * float(np.std(values, ddof=1)) / math.sqrt(len(values))


# ----------------------------------------------------------------------------- 1. equivalence

def test_seed_trials_equal_their_solo_runs(lm):
    trials = lm("seeds01", **{"run.seeds": "0,1"})
    for k in (0, 1):
        solo = lm(f"seed{k}", **{"run.seed": k})
        close(losses(trials, k), losses(solo), f"train loss of trial {k}")
        same_evals(evals(trials, k), evals(solo))  # steps 4 and 8
        assert sorted(evals(solo)) == [4, 8]
    # the two trials are two different runs, not one run twice
    assert abs(losses(trials, 0)[-1] - losses(trials, 1)[-1]) > 1e-3
    # every record of the run names its trial
    assert all(r.get("trial") in (0, 1) for r in read_metrics(trials))

    s = summary(trials)
    assert s["done"] and s["n_trials"] == 2 and s["n_frozen"] == 0 and "groups" not in s
    assert [t["trial"] for t in s["trials"]] == [0, 1]
    assert [t["settings"] for t in s["trials"]] == [{"run.seed": 0}, {"run.seed": 1}]
    assert not any(t["frozen"] for t in s["trials"])
    for k, t in enumerate(s["trials"]):
        solo = summary(lm(f"seed{k}", **{"run.seed": k}))
        close([t["train_loss"], t["valid_loss"], t["valid_ppl"]],
              [solo["train_loss"], solo["valid_loss"], solo["valid_ppl"]])
    v = [t["valid_loss"] for t in s["trials"]]
    close(s["mean"]["valid_loss"], np.mean(v))
    close(s["ci95"]["valid_loss"], t_half_width(v))
    # each trial's own outputs directory
    assert all((trials / "trials" / str(k)).is_dir() for k in (0, 1))


def test_lr_trials_equal_the_solo_runs_of_each_lr(lm):
    trials = lm("lr", **{"trials.lr": f"0.06,{LR_B}"})
    close(losses(trials, 0), losses(lm("seed0", **{"run.seed": 0})), "trial 0 (lr 0.06)")
    solo_b = lm("lr_b", **{"optim.lr": LR_B})
    close(losses(trials, 1), losses(solo_b), f"trial 1 (lr {LR_B})")
    same_evals(evals(trials, 1), evals(solo_b))
    assert abs(losses(trials, 0)[-1] - losses(trials, 1)[-1]) > 1e-4
    # each record's learning rate is its trial's schedule: warm-up to its own lr over 50 steps
    for k, lr in ((0, 0.06), (1, LR_B)):
        recs = train_records(trials, k)
        close([recs[s]["lr"] for s in (2, 8)], [lr * 1 / 50, lr * 7 / 50])
    s = summary(trials)
    assert "mean" not in s
    assert [(g["settings"], g["trials"]) for g in s["groups"]] == [
        ({"optim.lr": 0.06}, [0]), ({"optim.lr": LR_B}, [1])]
    for g in s["groups"]:
        close(g["mean"]["valid_loss"], s["trials"][g["trials"][0]]["valid_loss"])


# ----------------------------------------------------------------------------- 3. resume

def test_stopped_and_resumed_trials_log_what_an_uninterrupted_run_does(
        lm, tmp_path, tokenizer, train_main, capsys):
    straight = lm("seeds01", **{"run.seeds": "0,1"})
    run = tmp_path / "resumed"
    args = lm_args(run, tokenizer, **{"run.seeds": "0,1"})
    code, out, _ = call(train_main, args + ["--run.stop_after", "3"], capsys)
    assert code == 0 and "stopped at step 3" in out
    code, out, _ = call(train_main, args + ["--run.stop_after", "3"], capsys)  # 4-6
    assert code == 0 and "stopped at step 6" in out
    assert train_main(args) == 0  # 7-8

    def numbers(path):
        keys = ("loss", "grad_norm", "param_norm", "lr", "valid_loss")
        return sorted((r["step"], r["trial"], *(r.get(k) for k in keys))
                      for r in read_metrics(path))

    assert numbers(run) == numbers(straight)  # bit for bit, each record once
    s, want = summary(run), summary(straight)
    assert [(t["train_loss"], t["valid_loss"]) for t in s["trials"]] == \
        [(t["train_loss"], t["valid_loss"]) for t in want["trials"]]


# ----------------------------------------------------------------------------- 4. export

def test_an_exported_trial_is_its_solo_run(lm, tmp_path, eval_main, train_main):
    from jaxdepth.export_trial import main as export_main
    from jaxdepth.tasks import load_model

    trials = lm("seeds01", **{"run.seeds": "0,1"})
    solo = lm("seed1", **{"run.seed": 1})
    out = tmp_path / "trial1"
    assert export_main(["--run", str(trials), "--trial", "1", "--out", str(out)]) == 0

    # its checkpoints hold the solo run's arrays; its records and summary are the solo run's
    for step in (4, 8):
        got, got_cfg, _ = load_model(out, step)
        want, want_cfg, _ = load_model(solo, step)
        a = jax.tree.leaves(eqx.filter(got, eqx.is_array))
        b = jax.tree.leaves(eqx.filter(want, eqx.is_array))
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=1e-7)
        assert got_cfg.run.seed == 1 and not got_cfg.run.seeds
        assert got_cfg.model == want_cfg.model and got_cfg.optim == want_cfg.optim
    close(losses(out), losses(solo))
    same_evals(evals(out), evals(solo))
    s = summary(out)
    assert s["trial"] == 1 and s["settings"] == {"run.seed": 1} and not s["frozen"]
    close(s["valid_loss"], summary(solo)["valid_loss"])

    # eval.py on it, and eval.py --trial on the run, give the solo run's perplexity
    def perplexity(*args) -> float:
        path = tmp_path / f"eval{len(list(tmp_path.glob('eval*.json')))}.json"
        assert eval_main([*map(str, args), "--out", str(path)]) == 0
        return json.loads(path.read_text())["perplexity"]

    want = perplexity("--run", solo)
    close(perplexity("--run", out), want)
    close(perplexity("--run", trials, "--trial", 1), want)
    assert (trials / "trials" / "1" / "checkpoints" / "8").is_dir()

    # and it trains on as that solo run: resumed to 12 steps, the losses of a solo run of 12
    assert train_main(["--config", str(out / "config.json"), "--run.dir", str(out),
                       "--run.steps", "12"]) == 0
    longer = lm("seed1_12", steps=12, **{"run.seed": 1})
    close(losses(out, steps=12), losses(longer, steps=12))
    close(summary(out)["valid_loss"], summary(longer)["valid_loss"])


# ----------------------------------------------------------------------------- 5. freezing

def test_a_non_finite_trial_is_frozen_and_the_others_go_on(lm, tmp_path, tokenizer, train_main,
                                                           capsys):
    run = tmp_path / "frozen"
    code, out, err = call(train_main, lm_args(run, tokenizer, **{"trials.lr": "0.06,1e30"}),
                          capsys)
    assert code == 0, err[-3000:]
    s = summary(run)
    assert s["done"] and s["n_trials"] == 2 and s["n_frozen"] == 1
    assert [t["frozen"] for t in s["trials"]] == [False, True]
    # the healthy trial is its solo run; the mean is over it alone
    close(losses(run, 0), losses(lm("seed0", **{"run.seed": 0})))
    close(s["mean"]["valid_loss"], s["trials"][0]["valid_loss"])
    # the frozen one is reported once, by name, and kept at its last finite state
    warnings = [line for line in err.splitlines() if line.startswith("warning: trial 1 ")]
    assert len(warnings) == 1, err[-3000:]
    assert "optim.lr=1e+30" in warnings[0] and "frozen" in warnings[0]
    assert "non-finite" in warnings[0] and "at step 2" in warnings[0]
    recs = train_records(run, 1)
    assert not math.isfinite(recs[2]["param_norm"]) and recs[2]["frozen"] == 1.0
    assert all(math.isfinite(recs[s]["loss"]) and recs[s]["frozen"] == 1.0
               for s in range(3, STEPS + 1))
    frozen_evals = evals(run, 1)
    assert frozen_evals[4] == frozen_evals[8]  # no update since step 1
    assert "trial 1 (run.seed=0, optim.lr=1e+30): frozen" in out


def test_a_run_whose_every_trial_is_non_finite_fails(tmp_path, tokenizer, train_main, capsys):
    run = tmp_path / "all_frozen"
    code, _, err = call(train_main, lm_args(run, tokenizer, **{"trials.lr": "1e30,2e30"}),
                        capsys)
    assert code == 1, err[-3000:]
    line = error_line(err)
    assert "every trial is frozen" in line and "non-finite" in line and "step 2" in line
    assert "No checkpoint was saved yet" in line
    assert not (run / "summary.json").exists()


# ----------------------------------------------------------------------------- 6. config

def test_trial_grid_varies_the_seed_fastest():
    cfg = parse_args(["--run.seeds", "0,1", "--trials.lr", "1e-3,3e-3",
                      "--trials.weight_decay", "0,0.1"])
    grid = trial_grid(cfg)
    assert grid == [{"optim.lr": lr, "optim.weight_decay": wd, "run.seed": seed}
                    for lr in (1e-3, 3e-3) for wd in (0.0, 0.1) for seed in (0, 1)]
    cfgs = trial_configs(cfg)
    assert len(cfgs) == 8
    for c, g in zip(cfgs, grid):
        assert (c.optim.lr, c.optim.weight_decay, c.run.seed) == \
            (g["optim.lr"], g["optim.weight_decay"], g["run.seed"])
        assert c.run.seeds == "" and c.trials.lr == "" and c.trials.weight_decay == ""
        assert trial_configs(c) == [c]  # each trial is a solo run
    # a trials list alone: one trial per value, at run.seed
    assert trial_grid(parse_args(["--trials.task_seed", "3,5", "--run.seed", "7"])) == [
        {"task.seed": 3, "run.seed": 7}, {"task.seed": 5, "run.seed": 7}]
    assert trial_grid(parse_args([])) == [] and trial_configs(parse_args([]))[0].run.seed == 0


@pytest.mark.parametrize("argv, field", [
    (["--trials.n_layers", "2,4"], "trials.n_layers"),
    (["--trials.d_model", "32,64"], "trials.d_model"),
    (["--run.seeds", "0,1,0"], "run.seeds"),
    (["--trials.lr", "1e-3,1e-3"], "trials.lr"),
    (["--trials.lr", "1e-3,fast"], "trials.lr"),
    (["--trials.weight_decay", "0.1,-1"], "trials.weight_decay"),
], ids=["n_layers", "d_model", "repeated-seed", "repeated-lr", "not-a-number", "negative"])
def test_what_cannot_vary_is_refused_in_one_line(tmp_path, tokenizer, train_main, capsys,
                                                 argv, field):
    code, _, err = call(train_main, lm_args(tmp_path / "run", tokenizer) + argv, capsys)
    assert code == 2
    assert field in error_line(err)
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_args(argv)


def test_one_seed_is_the_solo_run(lm):
    one = lm("seeds1", **{"run.seeds": "1"})
    solo = lm("seed1", **{"run.seed": 1})
    assert all("trial" not in r for r in read_metrics(one))  # no trial axis
    close(losses(one), losses(solo))
    same_evals(evals(one), evals(solo))
    s = summary(one)
    assert "trials" not in s and "n_trials" not in s
    close(s["valid_loss"], summary(solo)["valid_loss"])


# ----------------------------------------------------------------------------- 7. sharding

def test_the_trial_axis_goes_over_data_when_the_trials_divide_it():
    from jaxdepth.config import MeshConfig
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer import trials as tr
    from jaxdepth.trainer.optim import make_optimizer
    from jaxdepth.trainer.sharding import make_mesh
    from jaxdepth.trainer.step import state_shardings

    cfg = parse_args(["--preset", "tiny-L2"])
    task = task_for(cfg)
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    for data, k, axis in ((8, 8, "data"), (2, 2, "data"), (2, 4, "data"), (2, 3, None),
                          (8, 2, None), (1, 2, None)):
        mesh = make_mesh(MeshConfig(data=data))
        assert tr.trial_axis(mesh, k) == axis, (data, k)
        cfgs = trial_configs(parse_args(["--preset", "tiny-L2", "--run.seeds",
                                         ",".join(map(str, range(k)))]))
        abstract, sh = tr.trial_shardings(cfgs, tx, mesh, task)
        assert abstract.frozen.shape == (k,) and abstract.state.model.embed.shape[0] == k
        _, solo = state_shardings(cfgs[0], tx, mesh, task)
        got, want = jax.tree.leaves(sh.state), jax.tree.leaves(solo)
        assert len(got) == len(want) > 0
        for s, w in zip(got, want):  # the solo layout behind a leading trial axis
            assert tuple(s.spec) == (axis, *w.spec), (s.spec, w.spec)
        assert tuple(sh.frozen.spec) == (axis,)
        want = ("data",) if axis else (None, "data")
        assert tuple(tr.batch_sharding(mesh, k).spec) == want


def test_sharded_trials_equal_the_same_trials_on_one_device(lm, tmp_path, tokenizer,
                                                            train_main):
    """8 trials over 8 devices (one each), 3 over 2 (trial axis replicated, rows split),
    2 over 2 (one each): each trial's losses are those of the same trials on one device."""
    from _train_helpers import saved_partition_specs

    def run(name, data, seeds):
        path = tmp_path / name
        assert train_main(lm_args(path, tokenizer, **{
            "mesh.data": data, "run.seeds": seeds, "run.stop_after": 2})) == 0
        return path

    eight = ",".join(map(str, range(8)))
    one_device = run("k8_d1", 1, eight)
    ref = {k: losses(one_device, k, steps=2) for k in range(8)}
    for k in (0, 1):  # the first steps of the 2-seed run of the other tests
        close(ref[k], losses(lm("seeds01", **{"run.seeds": "0,1"}), k)[:2])
    for name, data, seeds, axis in (("k8_d8", 8, eight, "data"), ("k3_d2", 2, "0,1,2", None),
                                    ("k2_d2", 2, "0,1", "data")):
        path = run(name, data, seeds)
        for k in range(len(seeds.split(","))):
            close(losses(path, k, steps=2), ref[k], f"{name} trial {k}")
        specs = saved_partition_specs(path, 2)
        assert specs["model.embed"][0] == axis, specs["model.embed"]
