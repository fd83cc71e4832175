"""The one place that decides what kind of run a config describes.

``task_for(cfg)`` looks at ``model.arch`` and ``task.name`` (nowhere else in the library does)
and returns the Task of that kind; each task module registers its class under a kind name.
``load_model`` restores any run's model through the same dispatch, so eval.py, pretrained
initialisation and the analyses read every kind of checkpoint alike.
"""
from __future__ import annotations

from ..config import FUSION_TASKS, PROBE_TASKS, TASKS, Config, ConfigError

_KINDS: dict[str, type] = {}


def register(kind: str):
    def deco(cls):
        _KINDS[kind] = cls
        return cls
    return deco


def kind_of(cfg: Config) -> tuple[str, dict]:
    """(registered kind, keyword options of its constructor), or ConfigError for a config no
    task can run."""
    arch, name = cfg.model.arch, cfg.task.name
    if cfg.task.pack and name not in TASKS:  # only prefix-LM fine-tuning has rows to pack
        raise ConfigError(f"task.pack: packs the examples of prefix-LM fine-tuning (task.name "
                          f"one of {', '.join(TASKS)}); task.name={name!r} has none to pack")
    if name in FUSION_TASKS:  # any backbone: its shape comes from task.init_from or the config
        return name, {}
    if arch == "encoder":
        if name:
            raise ConfigError(f"task.name: model.arch='encoder' pretrains with MLM (empty "
                              f"task.name) or is the backbone of {', '.join(FUSION_TASKS)}; "
                              f"got {name!r}")
        return "encoder_mlm", {}
    if cfg.model_section == "act":  # the ALBERT family
        if cfg.act.max_len < cfg.data.seq_len:
            raise ConfigError(f"act.max_len: {cfg.act.max_len} position embeddings cannot hold "
                              f"data.seq_len={cfg.data.seq_len}")
        if name and name not in PROBE_TASKS:
            raise ConfigError(f"task.name: {name!r} is a decoder task; encoders (model.arch="
                              f"{arch!r}) fine-tune on {', '.join(PROBE_TASKS)}")
        # ALBERT is the ACT layer iterated exactly M times; BERT unties the M layers.
        options = {"arch": arch, "untied": arch == "bert", "adaptive": arch == "act",
                   "halting": "fixed" if arch == "albert" else cfg.act.halting}
        if name:  # roles labels every token; the other probing tasks classify [CLS]
            return "probe", {**options, "token_level": name == "roles"}
        return "encoder_pretrain", options
    if name in PROBE_TASKS:
        raise ConfigError(f"task.name: {name!r} fine-tunes an encoder: set model.arch to act, "
                          f"albert or bert")
    assert not name or name in TASKS, name  # TaskConfig validated the name
    return ("prefix_lm" if name else "lm"), {}


def task_for(cfg: Config):
    """The Task (trainer/task.py) that runs cfg."""
    kind, options = kind_of(cfg)
    return _KINDS[kind](cfg, **options)


def load_model(run_dir, step: int | None = None, mesh=None, mesh_cfg=None, label: str = "step"):
    """(model, saved Config, step) of a run's checkpoint (latest by default), opened
    read-only, whatever kind of run wrote it."""
    from ..trainer import checkpoint as ckpt  # orbax: not needed to validate a config
    return ckpt.load_model(run_dir, task_for, step, mesh, mesh_cfg, label)
