"""One override syntax for every field: ``--section.field value`` (or ``--section.field=value``).

``--preset NAME`` is applied first, then ``--config FILE.json`` (a saved config), then the
field overrides in the order given; nothing else changes a default behind the user's back
(Petty et al.'s fine-tuning recipe is the explicit ``finetune`` preset: ``--preset
134M-L12+finetune``). ``--help`` (help.py) lists every field with its type, default and what
it means.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Sequence

from . import RECIPE_FIELDS, SECTIONS, Config, ConfigError, apply_overrides
from .help import help_text
from .presets import from_preset, presets
from .trials import TRIAL_FIELDS, TrialsConfig, optim_per_trial, per_trial
from .run_kinds import KINDS, kind_of

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def refuse_unread(cfg: Config, given) -> None:
    """ConfigError for the first field of `given` (``(section, name)`` pairs the user set
    explicitly, trial lists as the field they vary) that cfg's run kind does not read. Only
    what the command line gives is checked: a config file or preset holds every field."""
    kind = kind_of(cfg).NAME
    for section, name in given:
        setting = given_as = f"{section}.{name}"
        if section == "trials" and name in TRIAL_FIELDS:  # the field it varies
            setting = TRIAL_FIELDS[name][0]
        KINDS.refuse_unread(setting, kind, given_as)


def refuse_shadowed(cfg: Config, given) -> None:
    """ConfigError for the first field of `given` (``(section, name)`` pairs the user set
    explicitly) that a list of cfg's trials sets in every trial (``per_trial``), where the
    value given would go unused. The list may come from a config file: the field given is
    dropped all the same; a field a config file or preset sets is not checked, since those
    hold every field."""
    lists = per_trial(cfg)
    for section, name in given:
        setting = f"{section}.{name}"
        if setting in lists:
            raise ConfigError(f"{setting}: given with {lists[setting]}, which sets it for every "
                              f"trial; give one of them", field=setting)


def _parse_value(section: str, name: str, raw: str):
    f = {f.name: f for f in dataclasses.fields(SECTIONS[section])}[name]
    ftype = f.type if isinstance(f.type, str) else f.type.__name__
    if raw in f.metadata.get("words", {}):
        return f.metadata["words"][raw]
    try:
        if ftype == "bool":
            return _BOOLS[raw.lower()]
        if ftype == "int":
            return int(raw)
        if ftype == "float":
            return float(raw)
    except (KeyError, ValueError):
        raise ConfigError(f"{section}.{name}: cannot parse {raw!r} as {ftype}",
                          field=f"{section}.{name}") from None
    return raw


def read_config_file(path: Path) -> Config:
    """The Config a JSON file holds; any problem is a ConfigError naming the file, and the
    line of the offending field where the file has one."""
    if not path.is_file():
        raise ConfigError(f"config: file not found: {path}", field="config")
    try:
        text = path.read_text(encoding="utf-8")
        saved = json.loads(text)
    except UnicodeDecodeError as e:
        raise ConfigError(f"config: {path} is not UTF-8 text ({e.reason} at byte {e.start})",
                          field="config") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})",
                          field="config") from None
    try:
        return Config.from_dict(saved)
    except ConfigError as e:
        line = _line_of(text, e.field)
        raise ConfigError(f"{path}{f':{line}' if line else ''}: {e}", field=e.field) from None


def _line_of(text: str, field: str) -> int | None:
    """Line of ``"section": {... "name": ...`` for field "section.name" in a JSON text (None
    when it cannot be found, e.g. for a field the file does not set)."""
    pos, match = 0, None
    for key in field.split(".") if field else ():
        match = re.compile(r'"%s"\s*:' % re.escape(key)).search(text, pos)
        if match is None:
            return None
        pos = match.end()
    return text.count("\n", 0, match.start()) + 1 if match else None


def parse_args(argv: Sequence[str]) -> Config:
    """Build a Config from command-line arguments. Raises ConfigError naming the bad field."""
    args = [a for a in argv if a != "--debug"]  # the entry point's, not a config field
    if any(a in ("-h", "--help") for a in args):
        print(help_text())
        sys.exit(0)
    pairs: list[tuple[str, str]] = []
    rest = iter(args)
    for a in rest:
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r} (fields are given as --section.field "
                              "value)")
        key, eq, val = a[2:].partition("=")
        if not eq:  # the value is the next argument
            val = next(rest, None)
        if val is None:
            raise ConfigError(f"{key}: missing value", field=key)
        pairs.append((key, val))

    cfg = Config()
    preset = [v for k, v in pairs if k == "preset"]
    if preset:
        cfg = from_preset(preset[-1])
    for k, v in pairs:
        if k == "config":
            cfg = read_config_file(Path(v))
    overrides: dict[str, dict] = {}
    for k, v in pairs:
        if k in ("preset", "config"):
            continue
        sec, _, name = k.partition(".")
        if sec == "trials" and name not in {f.name for f in dataclasses.fields(TrialsConfig)}:
            can = ", ".join(f"trials.{n} ({f})" for n, (f, _) in TRIAL_FIELDS.items())
            raise ConfigError(f"{k}: not a trial field: the trials of a run share every array "
                              f"shape, so only run.seeds, {can} can vary between them",
                              field=k)
        if sec not in SECTIONS or name not in {f.name for f in dataclasses.fields(SECTIONS[sec])}:
            raise ConfigError(f"{k}: unknown field (see --help)", field=k)
        overrides.setdefault(sec, {})[name] = _parse_value(sec, name, v)
    cfg = apply_overrides(cfg, overrides) if overrides else cfg
    kind_of(cfg)  # refuse a model.arch / task.name combination no task runs, before any work
    given = [(sec, name) for sec, names in overrides.items() for name in names]
    refuse_unread(cfg, given)  # else silently ignored
    refuse_shadowed(cfg, given)  # else dropped from every trial
    return cfg


def preset_lines(cfg: Config) -> list[str]:
    """What the config's preset set, one line per section, and what the run kind's recipe set
    (printed at start-up): no recipe line when the config set every optimizer field itself."""
    table = presets()
    lines = []
    for part in cfg.preset.split("+") if cfg.preset else ():
        for sec, vals in table[part].items():
            lines.append(f"preset {part}: {sec}: " + ", ".join(f"{k}={v}" for k, v in vals.items()))
    # Not the recipe's: None (a field its optimizer does not read), or a field a trials list
    # sets, which every trial runs at a value of its own.
    taken = [f for f in RECIPE_FIELDS if f in cfg.optim.from_recipe
             and getattr(cfg.optim, f) is not None and f not in optim_per_trial(cfg)]
    if taken:
        values = ", ".join(f"{f}={getattr(cfg.optim, f)}" for f in taken)
        lines.append(f"recipe of run kind {kind_of(cfg).NAME}: optim: {values}")
    return lines
