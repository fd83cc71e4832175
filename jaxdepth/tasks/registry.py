"""The one place that decides what kind of run a config describes.

``task_for(cfg)`` returns the Task of the kind ``config.kind_of`` gives (the one function that
looks at ``model.arch`` and ``task.name`` together); each task module registers its class
under a kind name.
``load_model`` restores any run's model through the same dispatch, so eval.py, pretrained
initialisation and the analyses read every kind of checkpoint alike.
"""
from __future__ import annotations

from ..config import Config, kind_of

_KINDS: dict[str, type] = {}


def register(kind: str):
    def deco(cls):
        _KINDS[kind] = cls
        return cls
    return deco


def task_for(cfg: Config):
    """The Task (trainer/task.py) that runs cfg."""
    kind, options = kind_of(cfg)
    return _KINDS[kind](cfg, **options)


def load_model(run_dir, step: int | None = None, mesh=None, mesh_cfg=None, label: str = "step"):
    """(model, saved Config, step) of a run's checkpoint (latest by default), opened
    read-only, whatever kind of run wrote it."""
    from ..trainer import checkpoint as ckpt  # orbax: not needed to validate a config
    return ckpt.load_model(run_dir, task_for, step, mesh, mesh_cfg, label)
