"""Trials (jaxdepth/trainer/trials.py): K runs that share every array shape, trained side by
side as one compiled program, each the solo run its own config describes.

Every number is checked against an independent reference: the solo run of the trial's
settings (its losses, evaluations, checkpoint arrays and eval.py result), an uninterrupted run
(resume), the same trials on one device (sharding). Runs are tiny (tiny-L2 on the embedded
grammar, batches of 8, one device unless the test is about sharding), in-process, trained once
per module and shared between tests (``lm``), and compile each program once through a
persistent compilation cache: solo runs of one learning rate share their step, trial runs of
one K and one kind of setting share theirs.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import random
import shutil
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from _train_helpers import base_args, read_metrics, saved_partition_specs
from jaxdepth.config.cli import parse_args
from jaxdepth.config import ConfigError, MeshConfig
from jaxdepth.config.trials import trial_configs, trial_grid

STEPS = 8  # evaluations at 4 and 8, checkpoints at 4 and 8
LR_B = 0.03  # the lm recipe's lr is 0.06 (warm-up over 50 steps: every step here is in it)
# 8 trials of seed 0 (one a device in the sharding test): the recipe's lr, LR_B, one that goes
# non-finite at step 2 (its lr is 0 at step 1, as every trial's), and five more
LRS = (0.06, LR_B, 1e30, 0.01, 0.02, 0.04, 0.05, 0.07)
RTOL = 1e-5


def lm_args(run, tokenizer, steps: int = STEPS, **fields) -> list[str]:
    """A tiny-L2 run on one device: every step logged, evaluations and checkpoints at 4, 8."""
    more = {"mesh.data": 1, "run.eval_every": 4, "run.save_every": 4,
            "trials.evaluation": "vmapped", **fields}
    return [str(a) for a in base_args(run, tokenizer, steps, **more)]


class Runs:
    """Finished runs, each trained once per module: ``runs(name, args)`` -> its directory;
    ``runs.err[name]``: what it wrote to stderr (warnings)."""

    def __init__(self, root: Path, train_main):
        self.root, self.train_main = root, train_main
        self.done: dict[str, Path] = {}
        self.err: dict[str, str] = {}

    def __call__(self, name: str, args_for) -> Path:
        if name not in self.done:
            run = self.root / name
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = self.train_main([str(a) for a in args_for(run)])
            assert code == 0, err.getvalue()[-3000:]
            self.done[name], self.err[name] = run, err.getvalue()
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train_main):
    return Runs(tmp_path_factory.mktemp("runs"), train_main)


@pytest.fixture(scope="module")
def lm(runs, tokenizer):
    """lm(name, **fields) -> the directory of a finished lm_args run (trained once)."""
    return lambda name, **fields: runs(name, lambda run: lm_args(run, tokenizer, **fields))


def solo(lm, seed: int = 0, **fields) -> Path:
    name = "solo-" + "-".join(f"{k}={v}" for k, v in {"seed": seed, **fields}.items())
    return lm(name, **{"run.seed": seed, **fields})


def seed_trials(lm) -> Path:
    return lm("seeds01", **{"run.seeds": "0,1"})


def lr_list(lrs) -> str:
    return ",".join(map(str, lrs))


def lr_trials(lm) -> Path:
    """The 8 trials of LRS, on one device."""
    return lm("lr8", **{"trials.lr": lr_list(LRS)})


# ----------------------------------------------------------------------------- reading runs

def train_records(run, trial: int | None = None) -> dict[int, dict]:
    """step -> the training record of that trial (None: a run without trials); each step
    must be logged once."""
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


def first(run, trial: int | None, n: int = 2) -> np.ndarray:
    """The losses of steps 1..n of a trial of a run that went on or stopped there."""
    recs = train_records(run, trial)
    return np.array([recs[s]["loss"] for s in range(1, n + 1)])


def evals(run, trial: int | None = None, key: str = "valid_loss") -> dict[int, float]:
    """step -> that trial's evaluation `key`."""
    return {r["step"]: r[key] for r in read_metrics(run) if key in r and r.get("trial") == trial}


def summary(run) -> dict:
    return json.loads((Path(run) / "summary.json").read_text())


def close(got, want, what: str = "") -> None:
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=0, err_msg=what)


def same_evals(got: dict, want: dict, what: str = "") -> None:
    assert sorted(got) == sorted(want) and got, (got, want)
    close([got[s] for s in sorted(got)], [want[s] for s in sorted(want)], what)


def same_arrays(a, b) -> None:
    x = jax.tree.leaves(eqx.filter(a, eqx.is_array))
    y = jax.tree.leaves(eqx.filter(b, eqx.is_array))
    assert len(x) == len(y) > 0
    for u, v in zip(x, y):
        assert u.shape == v.shape and u.dtype == v.dtype
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=RTOL, atol=1e-7)


def call(main, args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(err: str) -> str:
    """The one line of a failed command (errors.run_main), no traceback."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def t_half_width(values) -> float:
    """Half-width of the 95% t interval of the mean (t_0.975 for 1-3 degrees of freedom)."""
    t = {1: 12.706204736, 2: 4.30265273, 3: 3.182446305}[len(values) - 1]
    return t * float(np.std(values, ddof=1)) / math.sqrt(len(values))


# ----------------------------------------------------------------------------- 1. equivalence

def test_seed_trials_equal_their_solo_runs(lm):
    trials = seed_trials(lm)
    for k in (0, 1):
        close(losses(trials, k), losses(solo(lm, k)), f"train loss of trial {k}")
        same_evals(evals(trials, k), evals(solo(lm, k)), f"valid loss of trial {k}")
        assert sorted(evals(trials, k)) == [4, 8]
    assert abs(losses(trials, 0)[-1] - losses(trials, 1)[-1]) > 1e-3  # two runs, not one twice
    assert {r.get("trial") for r in read_metrics(trials)} == {0, 1}  # every record names one

    s = summary(trials)
    assert s["done"] and s["n_trials"] == 2 and s["n_frozen"] == 0 and "groups" not in s
    assert s["evaluation"] == "vmapped"  # the same validation batches: one pass for both
    assert [(t["trial"], t["settings"], t["frozen"]) for t in s["trials"]] == [
        (0, {"run.seed": 0}, False), (1, {"run.seed": 1}, False)]
    for k, t in enumerate(s["trials"]):
        want = summary(solo(lm, k))
        close([t[n] for n in ("train_loss", "valid_loss", "valid_ppl")],
              [want[n] for n in ("train_loss", "valid_loss", "valid_ppl")], f"trial {k}")
    valid = [t["valid_loss"] for t in s["trials"]]
    close(s["mean"]["valid_loss"], np.mean(valid))
    close(s["ci95"]["valid_loss"], t_half_width(valid))


def test_lr_trials_equal_the_solo_runs_of_each_lr(lm):
    trials = lr_trials(lm)
    close(losses(trials, 0), losses(solo(lm, 0)), "trial 0 (lr 0.06)")
    solo_b = solo(lm, 0, **{"optim.lr": LR_B})
    close(losses(trials, 1), losses(solo_b), f"trial 1 (lr {LR_B})")
    same_evals(evals(trials, 1), evals(solo_b))
    assert abs(losses(trials, 0)[-1] - losses(trials, 1)[-1]) > 1e-4
    # seven different runs besides the frozen one
    assert len({float(losses(trials, k)[-1]) for k in range(len(LRS)) if k != 2}) == 7
    for k, lr in enumerate(LRS):  # its own schedule: warm-up to its lr over 50 steps
        recs = train_records(trials, k)
        if k == 2:  # frozen at step 2: not logged after it
            close(recs[2]["lr"], lr * 1 / 50, f"lr of trial {k}")
            continue
        close([recs[s]["lr"] for s in (2, 8)], [lr * 1 / 50, lr * 7 / 50], f"lr of trial {k}")
    s = summary(trials)
    assert [t["settings"] for t in s["trials"]] == [{"run.seed": 0, "optim.lr": lr} for lr in LRS]
    # the lr varies: a mean per lr (of one seed here, so no CI), over the trials not frozen
    assert "mean" not in s
    assert [(g["settings"], g["trials"]) for g in s["groups"]] == [
        ({"optim.lr": lr}, [k]) for k, lr in enumerate(LRS) if k != 2]
    for g in s["groups"]:
        close(g["mean"]["valid_loss"], s["trials"][g["trials"][0]]["valid_loss"])
        assert g["ci95"] == {}


def test_dropout_trials_equal_the_solo_runs_of_each_rate(lm):
    """trials.dropout 0,0.1 (model.dropout as a traced per-trial rate, trial_tracing.setting):
    the trial at 0.1 draws its solo run's masks, and the one at 0, which now runs through the
    dropout code with a key, keeps every unit as its solo run does without one."""
    trials = lm("drop", **{"trials.dropout": "0.0,0.1"})
    for k, rate in enumerate((0.0, 0.1)):
        one = solo(lm, **({"model.dropout": rate} if rate else {}))
        close(losses(trials, k), losses(one), f"trial {k} (dropout {rate})")
        same_evals(evals(trials, k), evals(one), f"trial {k}")
    assert abs(losses(trials, 0)[-1] - losses(trials, 1)[-1]) > 1e-4


def test_act_trials_of_ponder_weight_and_dropout_equal_their_solo_runs(tmp_path):
    """ACT pretraining with trials of act.tau and act.dropout (the ponder-weight sweep as
    one program): each trial's losses, ponder cost and mean iterations per step, and its
    Table 1 at the evaluation, equal its solo run's."""
    from jaxdepth.tasks import train
    from test_encoder_training import _cfg

    def cfg(name, **act):
        return _cfg(tmp_path / name, act={"halting_bias_init": -1.0, **act},
                    run={"steps": 6, "eval_every": 6, "save_every": 6}, **(
                        {"trials": {"act_dropout": "0.0,0.1", "tau": "0.0,0.05",
                                    "evaluation": "vmapped"}}
                        if name == "trials" else {}))

    s = train(cfg("trials"))
    assert s["evaluation"] == "vmapped"
    assert [t["settings"] for t in s["trials"]] == [
        {"act.dropout": d, "act.tau": t, "run.seed": 0} for d in (0.0, 0.1) for t in (0.0, 0.05)]
    # trial 3 (dropout 0.1, tau 0.05); trial 0's rate-0 case is the dropout test's
    one = train(cfg("solo3", dropout=0.1, tau=0.05))
    for key in ("loss", "ponder", "iterations"):
        got = [r[key] for r in read_metrics(tmp_path / "trials")
               if r.get("trial") == 3 and "ponder" in r]
        want = [r[key] for r in read_metrics(tmp_path / "solo3") if "ponder" in r]
        close(got, want, f"trial 3 {key}")
        assert len(got) == 6
    assert s["trials"][3]["mean_iterations"] == pytest.approx(one["mean_iterations"], rel=RTOL)
    # at step 1 (same weights) trials 0 and 1 differ by the ponder term alone: 0.05 * ponder
    step1 = {k: next(r for r in read_metrics(tmp_path / "trials")
                     if r.get("trial") == k and r.get("step") == 1 and "ponder" in r)
             for k in (0, 1)}
    assert step1[1]["ponder"] == step1[0]["ponder"]
    assert step1[1]["loss"] - step1[0]["loss"] == pytest.approx(0.05 * step1[0]["ponder"],
                                                                rel=1e-4)


def ft_args(run, tokenizer, n_eval: int, splits: str, **fields) -> list[str]:
    """Prefix-LM fine-tuning of tiny-L2 on the grammar's passivization, 4 steps with dropout,
    evaluated at 2 and 4 on n_eval examples of each of `splits`."""
    return base_args(run, tokenizer, 4, **{
        "mesh.data": 1, "run.eval_every": 2, "run.save_every": 4, "model.dropout": 0.1,
        "task.name": "passivization", "task.n_train": 16, "task.n_eval": n_eval,
        "task.eval_max": n_eval, "task.eval_splits": splits, "task.truncate": "true",
        "data.seq_len": 64, **fields})


def ft_trials(runs, tokenizer) -> Path:
    """4 fine-tuning trials, run seeds 0, 1 by task seeds 0, 1 (trial 3 prepares its own data
    in trials/3/data, and writes its evaluations to trials/3/evals.jsonl)."""
    return runs("ft-trials", lambda run: ft_args(run, tokenizer, n_eval=4, splits="dev", **{
        "run.seeds": "0,1", "trials.task_seed": "0,1"}))


def test_prefix_lm_trials_equal_their_solo_run(runs, tokenizer):
    """Fine-tuning on the embedded grammar's passivization task with dropout: trial 3 (task
    seed 1, run seed 1) prepares its own splits (trials/3/data) and equals the solo run of
    those seeds: losses, the dev loss and exact match of each evaluation, its predictions."""
    trials = ft_trials(runs, tokenizer)
    one = runs("ft-solo", lambda run: ft_args(run, tokenizer, n_eval=4, splits="dev",
                                              **{"run.seed": 1, "task.seed": 1}))
    # each task seed scores its own sample of the splits: evaluated one trial at a time
    assert summary(trials)["evaluation"] == "trial by trial"
    assert [t["settings"] for t in summary(trials)["trials"]] == [
        {"run.seed": s, "task.seed": ts} for ts in (0, 1) for s in (0, 1)]
    close(losses(trials, 3, steps=4), losses(one, steps=4))
    for key in ("dev_loss", "id_accuracy"):
        same_evals(evals(trials, 3, key), evals(one, None, key), key)
    assert sorted(evals(trials, 3, "dev_loss")) == [2, 4]
    mine = trials / "trials" / "3"
    assert (mine / "data").is_dir() and not (trials / "trials" / "1" / "data").exists()

    def jsonl(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    # its outputs under trials/3: each evaluation, and the final greedy decodings
    got, want = jsonl(mine / "evals.jsonl"), jsonl(one / "evals.jsonl")
    assert [(r["step"], r["final"], r["id_accuracy"]) for r in got] == \
        [(r["step"], r["final"], r["id_accuracy"]) for r in want] != []
    close([r["dev_loss"] for r in got], [r["dev_loss"] for r in want])
    got, want = jsonl(mine / "predictions" / "dev.jsonl"), jsonl(one / "predictions" / "dev.jsonl")
    assert [(r["input"], r["gold"], r["prediction"]) for r in got] == \
        [(r["input"], r["gold"], r["prediction"]) for r in want] != []
    # the other task seed's dev split is another one
    assert (trials / "trials" / "0" / "predictions" / "dev.jsonl").read_text() != \
        (mine / "predictions" / "dev.jsonl").read_text()


def test_prefix_lm_seed_trials_decode_side_by_side_as_their_solo_runs(runs, tokenizer):
    """Trials that score the same examples (run seeds only) decode them vmapped, in one
    program: trial 1's dev loss, exact match and every greedy prediction equal its solo run's."""
    def args(run, **fields):
        return ft_args(run, tokenizer, n_eval=8, splits="dev,gen_lexical", **fields)

    trials = runs("ft-seed-trials", lambda run: args(run, **{"run.seeds": "0,1",
                                                             "trials.evaluation": "vmapped"}))
    one = runs("ft-solo-seed1", lambda run: args(run, **{"run.seed": 1}))
    assert summary(trials)["evaluation"] == "vmapped"
    for key in ("dev_loss", "id_accuracy", "gen_accuracy"):
        same_evals(evals(trials, 1, key), evals(one, None, key), key)
    for split in ("dev", "gen_lexical"):
        got = (trials / "trials" / "1" / "predictions" / f"{split}.jsonl").read_text()
        want = (one / "predictions" / f"{split}.jsonl").read_text()
        assert got == want and got
        # two models decoding: trial 0's predictions (long argmax chains here) are others
        assert (trials / "trials" / "0" / "predictions" / f"{split}.jsonl").read_text() != got


def test_trials_evaluation_is_per_trial_on_the_cpu_unless_asked(tmp_path, tokenizer):
    """trials.evaluation auto: trial by trial on the CPU (K independent programs overlap
    there, measured faster than one vmapped program); an unknown value is refused."""
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer.trials import Trials

    cfg = parse_args(lm_args(tmp_path / "r", tokenizer, **{"run.seeds": "0,1",
                                                           "trials.evaluation": "auto"}))
    cfgs = trial_configs(cfg)
    trials = Trials(cfgs, [task_for(c) for c in cfgs], mesh=None)  # no mesh needed to decide
    assert jax.default_backend() == "cpu" and not trials.vmaps_evaluation()
    with pytest.raises(ConfigError, match=r"^trials\.evaluation: must be one of auto, vmapped, "
                                          r"trial_by_trial, got 'fast'$"):
        parse_args(lm_args(tmp_path / "r", tokenizer, **{"trials.evaluation": "fast"}))


def _long_wikiann(root: Path) -> Path:
    """A tiny WikiAnn whose training split mixes 5- to 8-word sentences with 30-word ones: the
    few-shot samples and seeds draw batches with different numbers of words in use."""
    from test_ner_job import _sentences, _write_wikiann
    from jaxdepth.data.finetune.ner_sentences import Sentence

    train = _sentences(40, 0)
    glued = [Sentence(sum((s.tokens for s in train[i:i + 5]), ()),
                      sum((s.tags for s in train[i:i + 5]), ())) for i in range(0, 20, 5)]
    train += glued
    random.Random(0).shuffle(train)
    root.mkdir(parents=True)
    _write_wikiann(root / "train", train)
    _write_wikiann(root / "dev", _sentences(10, 1))
    _write_wikiann(root / "test", _sentences(10, 2))
    return root


@pytest.fixture(scope="module")
def ner_args(tmp_path_factory):
    """ner_args(run, **fields): a tiny few-shot NER run on a frozen backbone (fusion.mode fe,
    DWAtt) over a WikiAnn-like corpus, evaluated at steps 2 and 4."""
    from jaxdepth.data.corpus.tokenizer import train_tokenizer
    from test_ner_job import _sentences

    root = tmp_path_factory.mktemp("ner")
    task_dir = _long_wikiann(root / "wikiann")
    tok = root / "tok.model"
    train_tokenizer([" ".join(s.tokens) for s in _sentences(40, 0)], 64).save(tok)

    def args(run, **fields):
        out = {"model.arch": "encoder", "model.vocab_size": 64, "model.d_model": 32,
               "model.n_layers": 1, "model.d_ff": 64, "model.n_heads": 2,
               "data.seq_len": 128, "data.batch_size": 8, "data.tokenizer": tok,
               "mesh.data": 1, "run.dir": run, "run.steps": 4, "run.eval_every": 2,
               "run.save_every": 4, "run.log_every": 1, "run.progress": "false",
               "task.name": "ner", "task.dir": task_dir,
               "fusion.method": "dwatt", "fusion.mode": "fe", **fields}
        if "task.init_from" in fields:  # the backbone is the source's: its model is not given
            out = {k: v for k, v in out.items() if not k.startswith("model.") or k == "model.arch"}
        return [x for k, v in out.items() for x in (f"--{k}", str(v))]

    args.root = root
    return args


def test_ner_fe_trials_of_several_shots_equal_their_solo_runs(runs, ner_args):
    """Few-shot NER on a frozen backbone (fusion.mode fe, DWAtt): of the trials of N = 1 and
    8 shots, whose solo runs bound the word slots a batch uses differently, and of head
    dropout 0 and 0.1 (fusion.dropout, traced per trial), the 1-shot one at 0.1 runs at the
    8-shot one's larger bound (NERTask.share_shapes) and still equals its solo run: losses,
    dev and test F1 of each evaluation."""
    from jaxdepth.tasks import task_for

    root, args = ner_args.root, ner_args

    # the case this is about: each solo run's own bound differs
    bounds = []
    for shots in (1, 8):
        task = task_for(parse_args(args(root / f"probe{shots}", **{"task.n_shot": shots})))
        bounds.append(task.prepare(root / f"probe{shots}", True, lambda: None).train_active)
    assert bounds[0] < bounds[1], bounds

    trials = runs("ner-trials", lambda run: args(run, **{"trials.n_shot": "1,8",
                                                         "trials.fusion_dropout": "0.0,0.1",
                                                         "trials.evaluation": "vmapped"}))
    one = runs("ner-solo1", lambda run: args(run, **{"task.n_shot": 1}))  # dropout 0.1
    assert [(t["settings"]["task.n_shot"], t["settings"]["fusion.dropout"])
            for t in summary(trials)["trials"]] == [(1, 0.0), (1, 0.1), (8, 0.0), (8, 0.1)]
    # the same dev and test sentences, their frozen states cached once: one vmapped pass
    assert summary(trials)["evaluation"] == "vmapped"
    close(losses(trials, 1, steps=4), losses(one, steps=4), "trial 1 (1 shot, dropout 0.1)")
    for key in ("dev_f1", "test_f1"):
        same_evals(evals(trials, 1, key), evals(one, None, key), key)
    assert sorted(evals(one, None, "dev_f1")) == [2, 4]
    got = [json.loads((trials / "trials" / str(k) / "analysis" / "ner.json").read_text())
           for k in (1, 3)]
    want = json.loads((one / "analysis" / "ner.json").read_text())
    assert got[0]["curve"] == want["curve"] and got[0]["best_dev_f1"] == want["best_dev_f1"]
    assert [g["train_sentences"] for g in got] == [3, 24]  # N x 3 entity types each
    last = [losses(trials, k, steps=4)[-1] for k in range(4)]
    assert abs(last[3] - last[1]) > 1e-3 and abs(last[0] - last[1]) > 1e-5

    # the frozen backbone's states on disk (fusion.cache_mib 0): each set of sentences
    # written once, dev and test by trial 0 for all four, the training sample by the first
    # trial of each N (1 shot: trial 0, 8 shots: trial 2); the same numbers as in memory
    from jaxdepth.tasks import state_cache

    state_cache._REUSED.clear()  # the run above left its states for this process to reuse
    on_disk = runs("ner-trials-disk", lambda run: args(run, **{
        "trials.n_shot": "1,8", "trials.fusion_dropout": "0.0,0.1",
        "trials.evaluation": "vmapped", "fusion.cache_mib": 0}))
    files = sorted(p.relative_to(on_disk).as_posix() for p in on_disk.rglob("cache/*.npy"))
    assert files == [f"trials/{k}/cache/{split}.process0.npy"
                     for k, split in ((0, "dev"), (0, "test"), (0, "train"), (2, "train"))]
    assert summary(on_disk)["evaluation"] == "vmapped"
    for k in range(4):
        close(losses(on_disk, k, steps=4), losses(trials, k, steps=4), f"trial {k}")
        for key in ("dev_f1", "test_f1"):
            assert evals(on_disk, k, key) == evals(trials, k, key), (k, key)


def test_trials_hold_a_frozen_pretrained_backbone_once(runs, ner_args):
    """Two seed trials over one pretrained backbone (task.init_from, fusion.mode fe) keep its
    arrays once, without a trial axis (TrainState.shared), in memory and in the checkpoint,
    while the head and fusion are stacked; each trial still equals its solo run (losses, dev
    and test F1, evaluated vmapped), and an exported trial holds the whole model."""
    from jaxdepth.config import Config
    from jaxdepth.tasks import load_model, task_for
    from jaxdepth.trainer import checkpoint as ckpt, restore as rs
    from jaxdepth.optim import make_optimizer
    from jaxdepth.trainer.sharding import make_mesh
    from jaxdepth.trainer.state import TrainState, state_shardings
    from jaxdepth.trainer.trials import export_trial

    pre = runs("ner-solo1", lambda run: ner_args(run, **{"task.n_shot": 1}))
    mine = {"task.init_from": pre, "task.n_shot": 1}
    trials = runs("ner-shared", lambda run: ner_args(run, **mine, **{
        "run.seeds": "0,1", "trials.evaluation": "vmapped"}))
    one = runs("ner-shared-solo1", lambda run: ner_args(run, **mine, **{"run.seed": 1}))
    assert summary(trials)["evaluation"] == "vmapped"
    close(losses(trials, 1, steps=4), losses(one, steps=4), "trial 1")
    for key in ("dev_f1", "test_f1"):
        same_evals(evals(trials, 1, key), evals(one, None, key), key)

    cfg = Config.from_dict(json.loads((trials / "config.json").read_text()))
    cfgs = trial_configs(cfg)
    abstract, shardings = state_shardings(cfgs, make_optimizer(cfgs[0].optim, 4),
                                          make_mesh(MeshConfig(data=1)), task_for(cfgs[0]))
    mngr = ckpt.open_manager(trials, read_only=True)
    try:
        state = rs.restore_state(mngr, 4, abstract, shardings)
    finally:
        mngr.close()

    def arrays(tree):
        return jax.tree.leaves(eqx.filter(tree, eqx.is_array))

    pretrained = arrays(load_model(pre)[0].backbone)
    assert not arrays(state.model.backbone)  # not in the stacked model
    shared = arrays(state.shared.backbone)
    assert [a.shape for a in shared] == [a.shape for a in pretrained]  # no trial axis
    for a, b in zip(shared, pretrained):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    stacked = arrays(state.model)
    assert stacked and all(a.shape[0] == 2 for a in stacked)
    assert not arrays(state.shared.head) and not arrays(state.shared.fusion)

    # a checkpoint of the layout before (K stacked copies of the backbone) is refused in one
    # line that says so, and left where it is
    import jax.numpy as jnp

    old = runs.root / "ner-shared-old-layout"
    shutil.copytree(trials, old)
    shutil.rmtree(old / "checkpoints")
    copies = jax.tree.map(lambda x: jnp.stack([x, x]), state.shared)
    s = state
    layout = TrainState(s.step, eqx.combine(s.model, copies), s.opt_state, s.key, s.hparams,
                        s.frozen)  # nothing shared: the backbone on the trial axis
    mngr = ckpt.open_manager(old, 1)
    data = json.loads((trials / "checkpoints" / "4" / "data" / "process_0-of-1.json").read_text())
    ckpt.save(mngr, 4, layout, [data], cfg)
    mngr.wait_until_finished()
    mngr.close()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = runs.train_main([str(a) for a in ner_args(old, **mine, **{
            "run.seeds": "0,1", "run.steps": 6})])
    assert code == 2 and "written before the trials kept their frozen backbone once" in \
        err.getvalue(), err.getvalue()[-2000:]
    assert sorted(p.name for p in (old / "checkpoints").iterdir()) == ["4"]
    # ... and so is its export, rather than an exported run without a checkpoint
    from jaxdepth.export_trial import main as export_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = export_main(["--run", str(old), "--trial", "1"])
    assert code == 2 and err.getvalue().splitlines() == [
        f"error: no readable checkpoint in {old / 'checkpoints'} (step 4: written before the "
        f"trials kept their frozen backbone once (it holds a copy per trial): resume or export "
        f"it with jaxdepth at commit ebc47d7 or earlier); nothing exported"], err.getvalue()
    assert not (old / "trials" / "1" / "checkpoints").exists()  # the refusal wrote nothing
    assert not (old / "trials" / "1" / ".export.json").exists()

    dest = export_trial(trials, 1, task_for)
    exported, _, _ = load_model(dest)
    for a, b in zip(arrays(exported), arrays(state.models().one(1)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(arrays(exported.backbone), pretrained, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- 3. resume

@pytest.fixture(scope="module")
def stopped(tmp_path_factory, tokenizer, train_main):
    """The 2-seed trials run stopped after step 3 (a checkpoint of step 3, no summary)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_main(lm_args(run, tokenizer, **{"run.seeds": "0,1", "run.stop_after": 3}))
    assert code == 0 and "stopped at step 3" in out.getvalue(), out.getvalue()[-2000:]
    return run


def test_stopped_and_resumed_trials_log_what_an_uninterrupted_run_does(
        lm, stopped, tmp_path, tokenizer, train_main):
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    assert train_main(lm_args(run, tokenizer, **{"run.seeds": "0,1"})) == 0  # steps 4-8

    def numbers(path):
        keys = ("loss", "grad_norm", "param_norm", "lr", "valid_loss", "frozen")
        return sorted(tuple(r.get(k, -1.0) for k in ("step", "trial", *keys))
                      for r in read_metrics(path))

    assert numbers(run) == numbers(seed_trials(lm))  # bit for bit, each record once
    got, want = summary(run)["trials"], summary(seed_trials(lm))["trials"]
    assert [(t["train_loss"], t["valid_loss"]) for t in got] == \
        [(t["train_loss"], t["valid_loss"]) for t in want]


# ----------------------------------------------------------------------------- 4. export

def test_an_exported_trial_is_its_solo_run(lm, tmp_path, eval_main):
    from jaxdepth.export_trial import main as export_main
    from jaxdepth.tasks import load_model

    trials, one = seed_trials(lm), solo(lm, 1)
    out = tmp_path / "trial1"
    assert export_main(["--run", str(trials), "--trial", "1", "--out", str(out)]) == 0
    for step in (4, 8):  # its checkpoints hold the solo run's arrays
        got, got_cfg, _ = load_model(out, step)
        want, want_cfg, _ = load_model(one, step)
        same_arrays(got, want)
        assert got_cfg.run.seed == 1 and not got_cfg.run.seeds
        assert got_cfg.model == want_cfg.model and got_cfg.optim == want_cfg.optim
    assert all("trial" not in r for r in read_metrics(out))  # its records, as the solo run's
    close(losses(out), losses(one))
    same_evals(evals(out), evals(one))
    s = summary(out)
    assert s["trial"] == 1 and s["settings"] == {"run.seed": 1} and not s["frozen"]
    close(s["valid_loss"], summary(one)["valid_loss"])

    # eval.py on it, and eval.py --trial on the run (exported to <run>/trials/1), give the
    # solo run's perplexity
    def perplexity(name, *args) -> float:
        path = tmp_path / f"{name}.json"
        assert eval_main([*map(str, args), "--out", str(path)]) == 0
        return json.loads(path.read_text())["perplexity"]

    want = perplexity("solo", "--run", one)
    close(perplexity("exported", "--run", out), want)
    close(perplexity("trial", "--run", trials, "--trial", 1), want)
    assert (trials / "trials" / "1" / "checkpoints" / "8").is_dir()


def test_an_exported_stopped_trial_resumes_as_its_solo_run(lm, stopped, tmp_path, train_main):
    """Trial 1 of the run stopped at step 3, exported and resumed alone to step 8, trains as
    the solo run of seed 1 did: the same losses at every step, the same evaluations."""
    from jaxdepth.export_trial import main as export_main

    out = tmp_path / "trial1"
    assert export_main(["--run", str(stopped), "--trial", "1", "--out", str(out)]) == 0
    assert not (stopped / "trials" / "1" / "checkpoints").exists()  # --out: the run untouched
    assert train_main(["--config", str(out / "config.json"), "--run.dir", str(out),
                       "--run.stop_after", "0"]) == 0
    one = solo(lm, 1)
    close(losses(out), losses(one))
    same_evals(evals(out), evals(one))
    close(summary(out)["valid_loss"], summary(one)["valid_loss"])


def test_an_export_to_a_directory_in_use_is_refused_before_anything_is_written(
        lm, stopped, tmp_path, capsys):
    """--out the run itself, a place inside it, or another run's directory: one line naming
    the directory, exit 2, and every file of both left as it was. An empty one is written."""
    from _train_helpers import snapshot
    from jaxdepth.export_trial import main as export_main

    run = tmp_path / "run"
    shutil.copytree(stopped, run)  # --out the run: the fixture stays whole even if it fails
    other = tmp_path / "solo"  # a run of its own: its metrics would be replaced
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"step": 1, "loss": 6.0}\n')
    (other / "config.json").write_text("{}")
    before = {d: snapshot(d) for d in (run, other)}
    mine = run / "trials" / "1"
    for out, why in [
            (run, f"is the run that trial 1 is exported from ({run}), whose files the export "
                  f"would change"),
            (run / "elsewhere", f"is inside the run that trial 1 is exported from ({run}), "
                                f"whose files the export would change"),
            (other, f"not empty (it holds config.json, metrics.jsonl); exporting trial 1 of "
                    f"{run} there would mix two runs' files")]:
        code, _, err = call(export_main, ["--run", run, "--trial", 1, "--out", out], capsys)
        assert code == 2
        assert error_line(err) == (f"config error: --out {out}: {why}; give a new or empty "
                                   f"directory (or no --out: {mine})")
    assert {d: snapshot(d) for d in (run, other)} == before
    assert not (run / "elsewhere").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_main(["--run", str(run), "--trial", "1", "--out", str(empty)]) == 0
    assert (empty / "checkpoints" / "3").is_dir() and (empty / "config.json").is_file()
    assert snapshot(run) == before[run]
    # the token files and the tokenizer, only ever replaced whole, are shared; the rest copied
    for name, shared in [("train.npy", True), ("tokenizer.model", True),
                         ("valid_docs.txt", False), ("source.json", False)]:
        assert (empty / "data" / name).samefile(run / "data" / name) == shared, name


def test_an_interrupted_export_finishes_when_rerun_and_no_other_goes_there(
        stopped, tmp_path, capsys, monkeypatch):
    """An export that stopped half-way (a full disk while writing its metrics) leaves its
    marker: the same export rerun finishes it; another trial's export there is refused."""
    import errno

    from jaxdepth.export_trial import main as export_main
    from jaxdepth.tasks import load_model
    from jaxdepth.trainer import trials

    out = tmp_path / "trial1"

    def full_disk(src, dest, k):
        raise OSError(errno.ENOSPC, "No space left on device", str(dest))

    with monkeypatch.context() as m:
        m.setattr(trials, "_write_metrics", full_disk)
        code, _, err = call(export_main, ["--run", stopped, "--trial", 1, "--out", out], capsys)
    assert code == 2 and "no space left on device" in error_line(err)
    assert (out / "checkpoints" / "3").is_dir() and not (out / "metrics.jsonl").exists()
    code, _, err = call(export_main, ["--run", stopped, "--trial", 0, "--out", out], capsys)
    assert code == 2
    assert error_line(err) == (
        f"config error: --out {out}: holds the export of trial 1 of {stopped.resolve()}; "
        f"exporting trial 0 of {stopped} there would mix two runs' files; give a new or empty "
        f"directory (or no --out: {stopped / 'trials' / '0'})")
    assert not (out / "metrics.jsonl").exists()
    code, printed, _ = call(export_main, ["--run", stopped, "--trial", 1, "--out", out], capsys)
    assert code == 0 and printed.strip() == str(out)
    assert sorted(r["step"] for r in read_metrics(out) if "grad_norm" in r) == [1, 2, 3]
    assert all("trial" not in r for r in read_metrics(out))
    _, cfg, step = load_model(out)
    assert step == 3 and cfg.run.seed == 1 and not cfg.run.seeds


def test_a_resumed_export_leaves_its_source_run_as_it_was(runs, tokenizer, tmp_path,
                                                          train_main):
    """Trial 3 of the fine-tuning trials (its own data and evals.jsonl under trials/3),
    exported and trained on to step 6: it appends its evaluations and rewrites what it
    prepares in its own files, and every file of the source run stays byte for byte."""
    from _train_helpers import snapshot
    from jaxdepth.export_trial import main as export_main

    run = tmp_path / "run"
    shutil.copytree(ft_trials(runs, tokenizer), run)  # the module's run stays whole if it fails
    before = snapshot(run)
    out = tmp_path / "trial3"
    assert export_main(["--run", str(run), "--trial", "3", "--out", str(out)]) == 0
    assert train_main(["--config", str(out / "config.json"), "--run.dir", str(out),
                       "--run.steps", "6"]) == 0
    assert [r["step"] for r in map(json.loads, (out / "evals.jsonl").read_text().splitlines())
            ] == [2, 4, 6]
    assert snapshot(run) == before


def test_eval_of_a_run_with_trials_asks_for_one_and_of_a_run_without_refuses_one(
        lm, eval_main, capsys):
    """Without --trial, a run with trials is named as such (not as corrupt checkpoints that
    do not match the model); --trial on a solo run is refused. Nothing is written."""
    from _train_helpers import snapshot

    trials, one = seed_trials(lm), solo(lm, 1)
    before = {d: snapshot(d) for d in (trials, one)}
    code, _, err = call(eval_main, ["--run", trials], capsys)
    assert code == 2
    assert error_line(err) == (f"config error: --trial: {trials} is a run with 2 trials, each "
                               f"its own model; give --trial k (0..1) to evaluate trial k")
    code, _, err = call(eval_main, ["--run", one, "--trial", 0], capsys)
    assert code == 2
    assert error_line(err) == (f"config error: --trial 0: {one} is a run without trials (no "
                               f"run.seeds or trials list in its config.json); evaluate it "
                               f"without --trial")
    assert {d: snapshot(d) for d in (trials, one)} == before


# ----------------------------------------------------------------------------- 5. freezing

def test_a_non_finite_trial_is_frozen_and_the_others_go_on(lm, runs):
    trials = lr_trials(lm)
    s = summary(trials)
    assert s["done"] and s["n_trials"] == len(LRS) and s["n_frozen"] == 1
    assert [t["frozen"] for t in s["trials"]] == [k == 2 for k in range(len(LRS))]
    assert 2 not in [k for g in s["groups"] for k in g["trials"]]  # the frozen one in no mean
    # the others are their solo runs (test_lr_trials_...); the frozen one is named once
    close(losses(trials, 0), losses(solo(lm, 0)))
    warnings = [line for line in runs.err["lr8"].splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, runs.err["lr8"][-3000:]
    assert warnings[0].startswith("warning: trial 2 (run.seed=0, optim.lr=1e+30)")
    for words in ("non-finite parameter norm", "at step 2", "frozen", "other trials go on"):
        assert words in warnings[0], (words, warnings[0])
    # ... is logged once as frozen, at the step it froze, and not after (its later values
    # mean nothing; test_metrics_writer: no non-finite value reaches TensorBoard)
    recs = train_records(trials, 2)
    assert sorted(recs) == [1, 2] and [recs[s]["frozen"] for s in (1, 2)] == [0.0, 1.0]
    assert not math.isfinite(recs[2]["param_norm"])
    assert all(math.isfinite(recs[s]["loss"]) for s in (1, 2))
    # ... and keeps its last finite state: the same evaluation at 4 and 8
    frozen = evals(trials, 2)
    assert frozen[4] == frozen[8] != evals(trials, 0)[8]


def test_a_run_whose_every_trial_is_non_finite_fails(tmp_path, tokenizer, train_main, capsys):
    run = tmp_path / "run"
    code, _, err = call(train_main, lm_args(run, tokenizer, **{  # lr_trials' program
        "trials.lr": lr_list(f"{k}e30" for k in range(1, 9))}), capsys)
    assert code == 1, err[-3000:]
    line = error_line(err)
    assert "every trial is frozen" in line and "non-finite parameter norm" in line
    assert "at step 2" in line and "No checkpoint was saved yet" in line
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
    for c, g in zip(cfgs, grid):  # each trial is the solo run of its settings
        assert (c.optim.lr, c.optim.weight_decay, c.run.seed) == tuple(g.values())
        assert c == parse_args(["--optim.lr", str(g["optim.lr"]), "--optim.weight_decay",
                                str(g["optim.weight_decay"]), "--run.seed", str(g["run.seed"])])
        assert trial_configs(c) == [c]
    # a trials list alone: one trial per value, at run.seed
    ft = ["--task.name", "passivization"]  # a kind of run that reads task.seed, task.init_from
    assert trial_grid(parse_args(ft + ["--trials.task_seed", "3,5", "--run.seed", "7"])) == [
        {"task.seed": 3, "run.seed": 7}, {"task.seed": 5, "run.seed": 7}]
    assert trial_grid(parse_args([])) == [] and trial_configs(parse_args([])) == [parse_args([])]
    # {seed}: each trial's run.seed, and a solo run's own (so a trial's config runs solo)
    seeded = ft + ["--task.init_from", "runs/pre-s{seed}", "--data.tokenizer", "t{seed}.model"]
    got = [(c.task.init_from, c.data.tokenizer)
           for c in trial_configs(parse_args(seeded + ["--run.seeds", "3,4"]))]
    assert got == [("runs/pre-s3", "t3.model"), ("runs/pre-s4", "t4.model")]
    (solo,) = trial_configs(parse_args(seeded + ["--run.seed", "5"]))
    assert (solo.task.init_from, solo.data.tokenizer) == ("runs/pre-s5", "t5.model")


@pytest.mark.parametrize("argv, field", [
    (["--trials.n_layers", "2,4"], "trials.n_layers"),
    (["--trials.d_model", "32,64"], "trials.d_model"),
    (["--run.seeds", "0,1,0"], "run.seeds"),
    (["--trials.lr", "1e-3,1e-3"], "trials.lr"),
    (["--trials.lr", "1e-3,fast"], "trials.lr"),
    (["--trials.weight_decay", "0.1,-1"], "trials.weight_decay"),
    (["--trials.dropout", "0,1.0"], "trials.dropout"),
    (["--model.arch", "encoder", "--trials.dropout", "0,0.1"], "trials.dropout"),
], ids=["n_layers", "d_model", "repeated-seed", "repeated-lr", "not-a-number", "negative",
        "rate-1", "encoder-dropout"])
def test_what_cannot_vary_is_refused_in_one_line(tmp_path, tokenizer, train_main, capsys,
                                                 argv, field):
    code, _, err = call(train_main, lm_args(tmp_path / "run", tokenizer) + argv, capsys)
    assert code == 2
    assert field in error_line(err)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_args(argv)


def test_one_seed_is_the_solo_run(lm):
    one = lm("seeds1", **{"run.seeds": "1"})
    assert all("trial" not in r for r in read_metrics(one))  # no trial axis
    assert not (one / "trials").exists()
    close(losses(one), losses(solo(lm, 1)))
    same_evals(evals(one), evals(solo(lm, 1)))
    s = summary(one)
    assert "trials" not in s and "n_trials" not in s
    close(s["valid_loss"], summary(solo(lm, 1))["valid_loss"])


# ----------------------------------------------------------------------------- 7. sharding

@pytest.mark.parametrize("data, k, axis", [
    (8, 8, "data"), (2, 2, "data"), (2, 4, "data"), (2, 3, None), (8, 2, None), (1, 2, None)])
@pytest.mark.fake_devices
def test_the_trial_axis_goes_over_data_when_the_trials_divide_it(data, k, axis):
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer import sharding as shd, state as st
    from jaxdepth.optim import make_optimizer
    from jaxdepth.trainer.sharding import make_mesh

    mesh = make_mesh(MeshConfig(data=data))
    assert shd.trial_mesh_axis(mesh, k) == axis
    cfgs = trial_configs(parse_args(["--preset", "tiny-L2", "--run.seeds",
                                     ",".join(map(str, range(k)))]))
    task = task_for(cfgs[0])
    tx = make_optimizer(cfgs[0].optim, cfgs[0].run.steps)
    abstract, sh = st.state_shardings(cfgs, tx, mesh, task)
    _, one = st.state_shardings(cfgs[:1], tx, mesh, task)  # a run of one: its axis unsharded
    own = lambda t: (t.step, t.model, t.opt_state, t.key)  # noqa: E731
    got, want = jax.tree.leaves(own(sh)), jax.tree.leaves(own(one))
    assert len(got) == len(want) > 0
    for s, w in zip(got, want):  # the solo layout behind a leading trial axis
        assert w.spec[0] is None and tuple(s.spec) == (axis, *w.spec[1:]), (s.spec, w.spec)
    assert tuple(sh.frozen.spec) == (axis,) and abstract.frozen.shape == (k,)
    # batches [K, B, ...]: a trial per device, or each trial's rows over data
    assert tuple(shd.batch_sharding(mesh, k).spec) == (("data",) if axis else (None, "data"))


@pytest.mark.fake_devices
def test_sharded_trials_equal_the_same_trials_on_one_device(lm, tmp_path, tokenizer,
                                                            train_main):
    """Two steps of the 8 lr trials over 8 devices (one trial each, its lr and frozen flag
    too), and of the first 3 over 2 devices (trial axis replicated, each trial's rows split
    over data): each trial's losses and frozen flags are those of lr_trials on one device."""
    ref = lr_trials(lm)
    for name, data, k, axis in (("k8-d8", 8, 8, "data"), ("k3-d2", 2, 3, None)):
        path = tmp_path / name
        assert train_main(lm_args(path, tokenizer, **{
            "mesh.data": data, "run.stop_after": 2, "trials.lr": lr_list(LRS[:k])})) == 0
        assert sorted(train_records(path, k - 1)) == [1, 2]
        for i in range(k):
            close(first(path, i), first(ref, i), f"{name} trial {i}")
            assert [train_records(path, i)[s]["frozen"] for s in (1, 2)] == \
                [train_records(ref, i)[s]["frozen"] for s in (1, 2)] == [0.0, float(i == 2)]
        spec = saved_partition_specs(path, 2)["state.model.embed"] or [None]
        assert spec[0] == axis, spec  # the checkpoint as the step laid it out
