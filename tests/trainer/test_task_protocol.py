"""A Task is what it declares (trainer/task.py): a kind written from the protocol alone, with
nothing of TaskBase, trains through the one trainer as a run of one trial and as two trials,
and each trial equals the run of one of its seed; the trainer asks a task nothing else (no
getattr or hasattr on one)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.config import Config
from jaxdepth.models.declared import Declared
from jaxdepth.trainer.loop import train
from jaxdepth.trainer.task import Task
from jaxdepth.config.trials import trial_configs

D, B = 8, 16  # features, rows a batch


class Linear(Declared):
    """y = x . w + b: the smallest model a task can train."""

    AXES = {"w": ("embed",), "b": ()}
    w: jax.Array
    b: jax.Array

    def __init__(self, *, key):
        self.w = jax.random.normal(key, (D,)) * 0.1
        self.b = jnp.zeros(())

    def __call__(self, x):
        return x @ self.w + self.b

    def flops_per_token(self, seq_len, **_):
        return 6 * D


def _mse(model, batch):
    return jnp.mean((jax.vmap(model)(batch["x"]) - batch["y"]) ** 2)


class Regression:
    """A least-squares task written from trainer/task.py alone: every method the protocol
    declares, nothing more."""

    reports_perplexity = False
    step_flops: dict = {}

    def __init__(self, cfg: Config):
        self.cfg, self.outputs, self.evaluated = cfg, None, []

    def build_model(self, *, key):
        return Linear(key=key)

    def prepare(self, run_dir, primary, barrier):
        self.outputs = Path(run_dir)
        rng = np.random.default_rng(1234)
        self.x = rng.normal(size=(256, D)).astype(np.float32)
        self.y = (self.x @ np.arange(1, D + 1, dtype=np.float32) / D).astype(np.float32)
        return self.x, self.y

    def dataset(self):
        order = np.random.default_rng(self.cfg.run.seed).permutation(256)
        batches = [{"x": self.x[order[i:i + B]], "y": self.y[order[i:i + B]]}
                   for i in range(0, 256, B)]
        return grain.MapDataset.source(batches).repeat()

    def initial_model(self, mesh, fresh):
        return None

    def model_ready(self, model):
        pass

    def objective(self):
        def fn(model, batch, key, totals):
            loss = _mse(model, batch)
            return loss, {"loss": loss}
        return fn, lambda batch: {}

    def evaluate(self, models, tasks, step, sharding, final):
        out = []
        for loss, t in zip(models(_mse, {"x": self.x, "y": self.y}), tasks):
            t.evaluated.append(step)
            out.append(({"valid_mse": float(loss)}, f"valid mse {float(loss):.5f}"))
        return out

    def evaluates_alike(self, tasks):
        return True  # the same validation set in every trial

    @staticmethod
    def share_shapes(tasks):
        pass

    @staticmethod
    def share_start(tasks):
        pass

    def trial_shared(self, model):
        return None

    def write_outputs_to(self, directory):
        self.outputs = Path(directory)

    def summary(self, model):
        return {"w": np.asarray(model.w).tolist()}


def test_regression_declares_exactly_the_protocol():
    declared = {n for n, v in vars(Task).items() if callable(v) and not n.startswith("_")}
    mine = {n for n, v in vars(Regression).items() if callable(v) and not n.startswith("_")}
    assert mine == declared


def _cfg(run: Path, **run_fields) -> Config:
    return Config.from_dict({"run": {"dir": str(run), "steps": 40, "eval_every": 20,
                                     "save_every": 20, "progress": False, "samples": 0,
                                     "grammar_samples": 0, **run_fields},
                             "optim": {"name": "adamw", "lr": 0.1, "warmup_steps": 0,
                                       "schedule": "constant", "weight_decay": 0.0},
                             "trials": {"evaluation": "vmapped"}})


def _losses(run: Path, trial=None) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and r.get("trial") == trial]


def test_a_task_of_the_protocol_alone_trains_as_one_trial_and_as_two(tmp_path):
    one = _cfg(tmp_path / "one", seed=1)
    s1 = train(one, [Regression(one)])
    assert s1["done"] and s1["valid_mse"] < 0.05  # it learned y = x . (1..8) / 8
    two = _cfg(tmp_path / "two", seeds="0,1")
    tasks = [Regression(c) for c in trial_configs(two)]
    s2 = train(two, tasks)
    assert s2["done"] and s2["n_trials"] == 2 and s2["evaluation"] == "vmapped"
    assert tasks[1].evaluated == [20, 40] and tasks[1].outputs == tmp_path / "two" / "trials" / "1"
    # trial 1 is the run of one of seed 1 (vmapped: the same numbers up to rounding)
    np.testing.assert_allclose(_losses(tmp_path / "two", 1), _losses(tmp_path / "one"),
                               rtol=1e-5)
    np.testing.assert_allclose(s2["trials"][1]["w"], s1["w"], rtol=1e-5)
    np.testing.assert_allclose(s2["trials"][1]["valid_mse"], s1["valid_mse"], rtol=1e-4)


def test_the_trainer_asks_a_task_nothing_it_does_not_declare():
    """No getattr or hasattr in trainer/ looks at a task (what the protocol does not declare
    is not asked); the ones left look at other objects, named here."""
    trainer = Path(__file__).resolve().parents[2] / "jaxdepth" / "trainer"
    found = set()
    for path in trainer.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")):
                found.add((path.name, node.func.id, ast.unparse(node.args[0])))
    assert found == {("memory.py", "getattr", "compiled"),  # equinox's compiled step
                     ("trials.py", "hasattr", "it")}  # a data iterator
