"""How a configuration field is declared and checked: the metadata helpers a section's fields
are declared with (``resumable``, ``one_of``), and the checks every section validates with
(``require``, ``positive``, ``typed``, ``check_one_of``, and ``check_reads``: a field set for
a choice that does not read it), each error a ConfigError naming its field."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import field
from typing import Any

from .choices import Choices
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


def one_of(default: str, allowed: tuple[str, ...]) -> Any:
    """A field of a few fixed values (``allowed``, in the order --help and tables list them),
    checked by ``check_one_of``: a choice with nothing to register but its name, read in the
    module that declares it (say, as a property of its section)."""
    return field(default=default, metadata={"allowed": allowed})


def check_one_of(obj: Any, section: str) -> None:
    """A ConfigError naming the first ``one_of`` field of `obj` whose value it does not allow."""
    for f in dataclasses.fields(obj):
        allowed = f.metadata.get("allowed")
        value = getattr(obj, f.name)
        require(allowed is None or value in allowed, f"{section}.{f.name}",
                f"must be one of {', '.join(allowed or ())}, got {value!r}")


def resumable(default: Any, words: dict | None = None) -> Any:
    """A field that a resumed run may change from what its checkpoint was saved with (how
    long or how visibly it trains, where it runs, how the same computation is laid out), as
    opposed to one that changes the model, the data or the optimizer. `words`: values the
    command line (and a config file) may give by name ({"auto": 0})."""
    return field(default=default, metadata={"resumable": True, "words": words or {}})


def check_reads(obj: Any, section: str, choice: str) -> None:
    """A ConfigError for the first field of obj (a section) changed from its default that the
    choice made in its field ``choice`` does not read (the choices' READS, choices.py). A
    registry not imported yet checks nothing: the command line imports them all."""
    registry = Choices.of_field(f"{section}.{choice}")
    for f in dataclasses.fields(obj) if registry is not None else ():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.init and getattr(obj, f.name) != default:
            registry.refuse_unread(f"{section}.{f.name}", getattr(obj, choice))
