"""A trial of a run with trials, exported as the single-trial run directory its solo run would
have written: its config, every checkpoint of the run as that trial's own (state, data-iterator
state and fingerprints of the solo layout), its metrics, its summary, its data. What reads a
run (eval.py, task.init_from, the analyses) reads it unchanged, and it resumes as a solo run.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..config import Config, ConfigError, MeshConfig, trial_configs
from ..errors import warn, writing
from . import checkpoint as ckpt
from . import trials as tr
from .optim import make_optimizer
from .sharding import make_mesh


class _SavedState:
    """A data iterator's saved state, handed to checkpoint.save in place of the iterator."""

    def __init__(self, state):
        self.state = state

    def get_state(self) -> bytes:
        return json.dumps(self.state, indent=4).encode()


def _link_tree(src: Path, dest: Path) -> None:
    """dest as a copy of src, its files hard-linked where the file system allows."""
    for root, _, files in os.walk(src):
        target = dest / Path(root).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            if not (target / f).exists():
                try:
                    os.link(Path(root) / f, target / f)
                except OSError:
                    shutil.copy2(Path(root) / f, target / f)


def export_trial(run_dir, k: int, task_for, out=None) -> Path:
    """Export trial k of the run in run_dir to `out` (default: its trial directory,
    <run>/trials/<k>, where its evaluations already are); returns that directory. task_for
    (jaxdepth.tasks.task_for) gives the Task that builds the model. Checkpoints already
    exported are kept; the others are written from the run's."""
    run = Path(run_dir)
    mngr = ckpt.open_manager(run, read_only=True)
    try:
        steps = sorted(mngr.all_steps())
        if not steps:
            raise ConfigError(f"--run: no checkpoint in {run / 'checkpoints'}", field="run")
        cfg = Config.from_dict(ckpt.saved_config(mngr, steps[-1]))
        cfgs = trial_configs(cfg)
        if len(cfgs) == 1:
            raise ConfigError(f"--trial: {run} is a run without trials (no run.seeds or "
                              f"trials list in its config)", field="trial")
        if not 0 <= k < len(cfgs):
            raise ConfigError(f"--trial {k}: {run} has trials 0-{len(cfgs) - 1}", field="trial")
        dest = Path(out) if out else tr.trial_dir(run, k)
        mesh = make_mesh(MeshConfig(data=1))
        tx = make_optimizer(cfgs[0].optim, cfg.run.steps)
        abstract, shardings = tr.trial_shardings(cfgs, tx, mesh, task_for(cfgs[0]))
        dest.mkdir(parents=True, exist_ok=True)
        solo = ckpt.open_manager(dest, cfg.run.keep)
        done = set(solo.all_steps())
        try:
            for step in steps:
                if step in done:
                    continue
                try:
                    data = ckpt.read_data_state(mngr, step)
                    state = tr.restore(mngr, step, abstract, shardings)
                    ckpt.verify(mngr, step, state)
                except Exception as e:
                    warn(f"checkpoint {step} in {run / 'checkpoints'} is unreadable "
                         f"({ckpt.unreadable_because(e)}); not exported")
                    continue
                ckpt.save(solo, step, state.trial(k),
                          _SavedState(data["trials"][k]), cfgs[k])
                solo.wait_until_finished()
        finally:
            solo.close()
    finally:
        mngr.close()
    ckpt.write_config(dest, cfgs[k])
    own = tr.trial_dir(run, k)  # what its task wrote while training (evaluations, analyses)
    if own.is_dir() and own.resolve() != dest.resolve():
        _link_tree(own, dest)
    source = tr.data_dir(run, cfgs, k)
    if (source / "data").is_dir() and source.resolve() != dest.resolve():
        _link_tree(source / "data", dest / "data")
    _write_metrics(run / "metrics.jsonl", dest / "metrics.jsonl", k)
    summary = run / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        mine = s["trials"][k]
        run_level = {n: v for n, v in s.items()
                     if n not in ("trials", "mean", "ci95", "groups", "n_trials", "n_frozen",
                                  "evaluation")}
        with writing(dest / "summary.json"):
            (dest / "summary.json").write_text(json.dumps(
                {**run_level, **{n: v for n, v in mine.items() if n != "trial"},
                 "run_dir": str(dest), "checkpoints": str(dest / "checkpoints"),
                 "metrics": str(dest / "metrics.jsonl"), "exported_from": str(run),
                 "trial": k}, indent=2))
    return dest


def _write_metrics(src: Path, dest: Path, k: int) -> None:
    """Trial k's records of a run's metrics.jsonl, as its solo run would have written them."""
    if not src.is_file():
        return
    lines = []
    for line in src.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a run killed mid-write: its torn record
            continue
        if rec.pop("trial", None) == k:
            lines.append(json.dumps(rec))
    with writing(dest):
        dest.write_text("".join(line + "\n" for line in lines))
