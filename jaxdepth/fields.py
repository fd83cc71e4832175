"""How a configuration field is declared and checked: the metadata helpers a section's fields
are declared with (``resumable``, ``one_of``), the settings a choice declares in its own
module (``Setting``, a choice class's ``FIELDS``, added to its section by ``declared_by_choices``
and checked by ``check_declared``), the section fields a choice says only it reads (its
``SETTINGS``, checked by ``check_settings``), and the checks every section validates with (``require``,
``positive``, ``typed``), each error a ConfigError naming its field."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable

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



@dataclass(frozen=True)
class Setting:
    """A config field that a choice (a schedule, an optimizer: a class of a registry,
    jaxdepth/choices.py) declares in its own module, in its class's ``FIELDS`` {name: Setting}:
    the field joins the section of the choice's registry field (``optim`` for optim.schedule),
    --help shows ``doc`` and the choices that read it, a value failing ``check`` is refused
    as ``must`` says, and one changed from its default while the choice made is another is
    refused (``check_declared``)."""
    default: Any  # its type (int, float, bool or str) is the field's
    doc: str
    check: Callable[[Any], bool] = lambda value: True
    must: str = ""  # what check asks, for the error ("must be in (0, 1]")
    resumable: bool = False

    @property
    def type(self) -> str:
        return type(self.default).__name__


def declared_by_choices(section: str):
    """Class decorator, beneath ``@dataclass``: adds to a section the fields that the choices
    of its registries declare (``Setting``), each field read by the choices that declare it."""
    def add(cls):
        annotations = cls.__dict__.get("__annotations__", {})
        for choice_field, registry in Choices.registries():
            if choice_field.partition(".")[0] != section:
                continue
            declared: dict[str, tuple[Setting, list[str]]] = {}
            for name in registry.names():
                for fname, setting in getattr(registry(name), "FIELDS", {}).items():
                    declared.setdefault(fname, (setting, []))[1].append(name)
            for fname, (setting, readers) in declared.items():
                if fname in annotations:
                    raise TypeError(f"{section}.{fname}, declared by {choice_field} "
                                    f"{readers[0]}, is a field of the section already")
                annotations[fname] = setting.type
                setattr(cls, fname, field(default=setting.default, metadata={
                    "setting": setting, "choice": choice_field, "readers": tuple(readers),
                    "resumable": setting.resumable}))
        cls.__annotations__ = annotations
        return cls
    return add


def check_declared(obj: Any, section: str, undecided: frozenset = frozenset()) -> None:
    """ConfigError for the first field of obj (a section) declared by a choice (``Setting``)
    whose value fails its check, or that is changed from its default while the choice made is
    one that does not read it; undecided: choice fields not made yet (left to a recipe)."""
    for f in dataclasses.fields(obj):
        if "setting" not in f.metadata:
            continue
        setting, value, name = f.metadata["setting"], getattr(obj, f.name), f"{section}.{f.name}"
        require(setting.check(value), name, f"{setting.must}, got {value!r}")
        choice_field, readers = f.metadata["choice"], f.metadata["readers"]
        chosen = getattr(obj, choice_field.partition(".")[2])
        if choice_field.partition(".")[2] not in undecided:
            _refuse_unread(name, value == _default(f), choice_field, chosen, readers)


def check_settings(obj: Any, section: str) -> None:
    """ConfigError for the first field of obj (a section) that the choices of one of the
    section's registries declare as theirs alone (``SETTINGS``, a fusion method's), changed
    from its default while the choice made is another. A registry not imported yet (found
    by its field, jaxdepth/choices.py) checks nothing: the command line imports them all."""
    for choice_field, registry in Choices.registries():
        if choice_field.partition(".")[0] != section:
            continue
        chosen = getattr(obj, choice_field.partition(".")[2])
        for f in dataclasses.fields(obj):
            readers = registry.readers(f.name)
            if readers:
                _refuse_unread(f"{section}.{f.name}", getattr(obj, f.name) == _default(f),
                               choice_field, chosen, readers)


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _refuse_unread(name: str, is_default: bool, choice_field: str, chosen: str,
                   readers: tuple[str, ...]) -> None:
    require(is_default or chosen in readers, name,
            f"{choice_field} {chosen} does not read it (read by: {', '.join(readers)})")
