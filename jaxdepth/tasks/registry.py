"""The Task of each run kind, its training, and any run's model.

``train(cfg)`` trains with one Task per trial; ``task_for(cfg)`` builds the Task that runs
cfg's kind (run_kinds.kind_of: the one function that looks at ``model.arch`` and
``task.name`` together; each Task class names the kind it runs, ``TaskBase.RUNS``).
``load_model`` restores any run's model through the same dispatch, so eval.py, pretrained
initialisation and the analyses read every kind of checkpoint alike.
"""
from __future__ import annotations

from pathlib import Path

from ..config import Config, ConfigError
from ..config.trials import trial_configs
from ..config.run_kinds import kind_of
from .task_base import runner


def task_for(cfg: Config):
    """The Task (trainer/task.py) that runs cfg."""
    kind = kind_of(cfg)
    return runner(kind)(cfg, **kind.options(cfg))


def load_model(run_dir, step: int | None = None, mesh=None, mesh_cfg=None, label: str = "step"):
    """(model, saved Config, step) of a run's checkpoint (latest by default), opened
    read-only, whatever kind of run wrote it."""
    from ..trainer import restore as rs  # orbax: not needed to validate a config
    return rs.load_model(run_dir, task_for, step, mesh, mesh_cfg, label)


def load_init_from(cfg: Config, mesh):
    """load_model of checkpoint task.init_step (0: latest) of run task.init_from, placed like
    this run's model."""
    try:
        return load_model(Path(cfg.task.init_from), cfg.task.init_step or None, mesh, cfg.mesh,
                          label="task.init_step")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"task.init_from: {e}") from None


def check_shape(section: str, mine: dict, theirs: dict, src, step: int) -> None:
    """A ConfigError naming the first shape field of ``section`` (``shape()``) in which this
    run's model differs from the pretrained checkpoint it starts from."""
    for f, value in mine.items():
        if value != theirs[f]:
            raise ConfigError(f"{section}.{f}: {value} here but {theirs[f]} in the pretrained "
                              f"checkpoint {src} (step {step}); start from its config: "
                              f"--config {Path(src) / 'config.json'}")


def train(cfg: Config) -> dict:
    """Run (or resume) the training cfg describes, with one task per trial if it has trials;
    returns its summary."""
    from ..trainer.loop import train as run
    tasks = [task_for(c) for c in trial_configs(cfg)]
    return run(cfg, tasks if len(tasks) > 1 else tasks[0])
