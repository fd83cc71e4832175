"""The layouts of a saved config.json: older ones (versions 1-4) upgraded to today's on reading
(``upgrade``, called by config.Config.from_dict)."""
from __future__ import annotations

import json

from ..models.archs import arch as arch_class, arch_names
from ..choices import Choices
from ..fields import require
from .task_names import FUSION_TASKS


def upgrade(d: dict, model_cls: type) -> dict:
    """A config dict of an older layout in today's (version 5); others unchanged. model_cls:
    config.ModelConfig (its fields and default model.arch).

    Version 1 described act/albert/bert models in the act section but took their vocabulary
    from model.vocab_size, and wrote every section whatever the architecture: the section
    that did not describe the model held values the run never read, and they are dropped.
    Versions 1-3 accepted model/act fields for a fusion run over task.init_from (whose
    backbone is the source's); never read, they are dropped. Versions 1-4 saved settings
    whatever the choice that reads them (optim.b1, b2 and eps whatever the optimizer, the
    decoder's own model fields for model.arch encoder, Base+n's fusion.extra_layers for every
    method); those the choice made does not read (its READS, jaxdepth/choices.py), which
    today's config refuses, are dropped."""
    version = d.get("version", 1)
    require(version in (1, 2, 3, 4, 5), "version",
            f"must be 1, 2, 3, 4 or 5, got {json.dumps(version)}")
    if version == 5:
        return d
    d = _drop_unread_settings(d)
    if version == 4:
        return {**d, "version": 5}
    d = _upgrade_model_sections(d, model_cls) if version == 1 else d
    return {**_drop_fusion_model(d), "version": 5}


def _drop_unread_settings(d: dict) -> dict:
    """d without the settings that the choices it names do not read (their READS); a registry
    not imported drops nothing (config validation then names them)."""
    for choice_field, registry in Choices.registries():
        section, _, name = choice_field.partition(".")
        values = d.get(section)
        if not isinstance(values, dict) or values.get(name) not in registry.names():
            continue
        readers = {k: registry.readers(f"{section}.{k}") or registry.names() for k in values}
        d = {**d, section: {k: v for k, v in values.items() if values[name] in readers[k]}}
    return d


def _drop_fusion_model(d: dict) -> dict:
    model, task = d.get("model", {}), d.get("task", {})
    if not isinstance(model, dict) or not isinstance(task, dict):
        return d  # from_dict names whatever is malformed
    if task.get("init_from") and task.get("name") in FUSION_TASKS:
        return {**d, "model": {k: v for k, v in model.items() if k == "arch"}, "act": {}}
    return d


def _upgrade_model_sections(d: dict, model_cls: type) -> dict:
    model = d.get("model")
    if not isinstance(model, dict) or not isinstance(d.get("act", {}), dict):
        return d  # from_dict names whatever is malformed
    arch = model.get("arch", model_cls.arch)
    if arch in arch_names() and arch_class(arch).SECTION == "act":
        act = {**d.get("act", {})}
        if "vocab_size" in model:
            act["vocab_size"] = model["vocab_size"]
        return {**d, "model": {"arch": arch}, "act": act}
    return {**d, "act": {}}

