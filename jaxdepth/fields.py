"""How a configuration field is declared and checked: the metadata helpers a section's fields
are declared with (``resumable``, ``for_archs``) and the checks every section
validates with (``require``, ``positive``, ``typed``), each error a ConfigError naming its
field."""
from __future__ import annotations

import json
from dataclasses import field
from typing import Any

from .errors import ConfigError


def require(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {msg}", field=name)


# What a field's annotation accepts from a JSON config file: JSON has no separate int and
# float, so an integer is a valid float; a bool is never a number.
_ACCEPTS = {"int": ((int,), "an integer"), "float": ((int, float), "a number"),
            "bool": ((bool,), "true or false"), "str": ((str,), "a string")}


def typed(name: str, ftype: str, value: Any) -> Any:
    """value checked against the field's declared type (floats given as integers become
    floats)."""
    kinds, what = _ACCEPTS[ftype]
    ok = isinstance(value, kinds) and (ftype == "bool" or not isinstance(value, bool))
    require(ok, name, f"must be {what}, got {json.dumps(value)}")
    return float(value) if ftype == "float" else value


def positive(obj: Any, section: str, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        require(v > 0, f"{section}.{n}", f"must be positive, got {v}")



def resumable(default: Any) -> Any:
    """A field that a resumed run may change from what its checkpoint was saved with (how
    long or how visibly it trains, where it runs, how the same computation is laid out), as
    opposed to one that changes the model, the data or the optimizer."""
    return field(default=default, metadata={"resumable": True})


def for_archs(*archs: str, default: Any, may_resume: bool = False) -> Any:
    """A model-section field that only these model.arch values read (the decoder's relative
    positions, say): set for another architecture it is refused (``Config``), not ignored.
    may_resume: also ``resumable``."""
    return field(default=default, metadata={"archs": archs, "resumable": may_resume})

