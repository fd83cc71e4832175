"""The installed package runs without the checkout: a wheel built from the repository,
installed in a fresh environment, trains (``jaxdepth-train``), evaluates (``jaxdepth-eval``)
and runs a sweep unit (``python -m jaxdepth.experiments.depth_sweep unit``) from a directory
that holds no source, the package imported from that environment."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _train_helpers import REPO, base_args, subprocess_env


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    return res.stdout


@pytest.mark.slow
def test_a_wheel_trains_evaluates_and_runs_a_unit_without_the_checkout(tmp_path, tokenizer):
    source = tmp_path / "source"  # the package's files alone, so the build leaves no trace
    shutil.copytree(REPO / "jaxdepth", source / "jaxdepth",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    dist = tmp_path / "dist"
    _ok(subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(dist)], capture_output=True,
                       text=True, timeout=600))
    wheel = next(dist.glob("jaxdepth-*.whl"))
    venv = tmp_path / "venv"  # its dependencies are this environment's (no network)
    _ok(subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       capture_output=True, text=True, timeout=300))
    bin_dir = venv / "bin"
    _ok(subprocess.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps",
                        str(wheel)], capture_output=True, text=True, timeout=600))

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}

    def run(*cmd):
        return _ok(subprocess.run([str(c) for c in cmd], cwd=work, capture_output=True,
                                  text=True, env=env, timeout=600))

    where = Path(run(bin_dir / "python", "-c", "import jaxdepth; print(jaxdepth.__file__)")
                 .strip())
    assert where.is_relative_to(venv), where

    trained = work / "run"
    run(bin_dir / "jaxdepth-train", *base_args(trained, tokenizer, 4))
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["done"] and summary["step"] == 4
    result = json.loads(run(bin_dir / "jaxdepth-eval", "--run", trained))
    assert result["step"] == 4 and result["loss"] == pytest.approx(summary["valid_loss"])

    sweep = work / "sweep"
    run(bin_dir / "python", "-m", "jaxdepth.experiments.depth_sweep", "plan", "--out", sweep,
        "--size", "tiny", "--depths", "1", "--seeds", "0", "--tasks", "none", "--pretrain",
        "run.steps=4", "--pretrain", "run.save_every=4", "--pretrain", "data.batch_size=8",
        "--pretrain", "data.seq_len=32", "--pretrain", "data.grammar_docs=300")
    run(bin_dir / "python", "-m", "jaxdepth.experiments.depth_sweep", "unit", "pretrain-L1",
        "--out", sweep)
    row = json.loads((sweep / "results" / "pretrain-L1-s0.json").read_text())
    assert row["step"] == 4 and row["provenance"]["commit"] is None  # no git tree: a wheel
    assert os.path.isfile(sweep / "pretrain" / "L1-s0" / "summary.json")
