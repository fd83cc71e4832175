"""A registry of the classes that are the values of one config field (fusion.method,
optim.name): a class registers by being defined (``Registered``), and a package of choices
imports every module it holds, so a new choice is a new module and nothing else.

A choice says which settings it reads in one way, its ``READS``: the "section.field" settings
(or whole sections) that it reads and some other choice of its registry does not. A setting
that no choice of a registry declares is read by all of them. From READS alone come --help's
"read by" lists, the refusal of a setting given for a choice that does not read it
(``Choices.refuse_unread``) and the upgrade of saved configs that held such settings.

Every registry is found by its field (``Choices.of_field``): --help lists a field's choices
and readers from there (config/help.py), and a section checks the settings its choices read
(fields.check_reads), whichever package holds the classes, so neither names a registry field by
field."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, ClassVar, Generic, Iterable, TypeVar

from .errors import ConfigError

C = TypeVar("C", bound=type)


class Choices(Generic[C]):
    _of_field: dict[str, "Choices"] = {}  # every registry, by the field it gives values to

    def __init__(self, what: str, field: str | None,
                 order: Callable[[C], object] = lambda c: 0):
        """field: the config field ("section.name") whose values the classes are, or the
        "run kind"; None for a registry that is no field's (the Tasks, keyed by their kind)."""
        self.what, self.field, self.order = what, field, order
        self._by_name: dict[str, C] = {}
        if field is not None:
            Choices._of_field[field] = self

    @classmethod
    def of_field(cls, field: str) -> "Choices | None":
        """The registry of config field ``field`` ("section.name"), if one is imported."""
        return cls._of_field.get(field)

    @classmethod
    def registries(cls) -> list[tuple[str, "Choices"]]:
        """(field, registry) for every registry imported so far."""
        return list(cls._of_field.items())

    def add(self, cls: C) -> None:
        if cls.NAME in self._by_name:
            raise TypeError(f"{self.what} {cls.NAME!r} is defined twice: "
                            f"{self._by_name[cls.NAME].__module__} and {cls.__module__}")
        self._by_name[cls.NAME] = cls

    def __call__(self, name: str) -> C:
        """The choice called ``name``; a ConfigError naming the field for any other name (a
        registry of no field: a TypeError, the code's error)."""
        if name not in self._by_name:
            if self.field is None:
                raise TypeError(f"no {self.what} {name!r} is defined")
            raise ConfigError(f"{self.field}: must be one of {', '.join(self.names())}, "
                              f"got {name!r}", field=self.field)
        return self._by_name[name]

    def names(self) -> tuple[str, ...]:
        """Every choice's name, ordered by ``order`` then name."""
        return tuple(sorted(self._by_name, key=lambda n: (self.order(self._by_name[n]), n)))

    def readers(self, setting: str) -> tuple[str, ...] | None:
        """The choices that read ``setting`` ("section.field"): those whose READS name it or
        its section; None when none does (then every choice reads it)."""
        wanted = {setting, setting.partition(".")[0]}
        return tuple(n for n in self.names() if wanted & set(self._by_name[n].READS)) or None

    def refuse_unread(self, setting: str, chosen: str, given_as: str | None = None) -> None:
        """A ConfigError naming the field ``given_as`` (a trials list that varies
        ``setting``; default: the setting) when some choice declares that it reads
        ``setting`` and ``chosen`` is not one of them."""
        readers = self.readers(setting)
        if readers is not None and chosen not in readers:
            shown = setting if given_as in (None, setting) else f"{given_as} (varies {setting})"
            raise ConfigError(f"{shown}: {self.field} {chosen} does not read it (read by: "
                              f"{', '.join(readers)})", field=given_as or setting)


class Registered:
    """A base for a field's choice classes: a subclass that defines a ``NAME`` registers
    itself in ``REGISTRY``, its field's Choices, once ``defined`` accepts it."""

    REGISTRY: ClassVar[Choices]
    NAME: ClassVar[str]  # the field's value
    READS: ClassVar[tuple[str, ...]] = ()  # settings it reads and another choice does not

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "NAME" in cls.__dict__:
            cls.defined()
            cls.REGISTRY.add(cls)

    @classmethod
    def defined(cls) -> None:
        """A TypeError for a choice that lacks what its kind of choice must define: refused
        when the class is defined, not when a config first reaches it."""


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module of a package of choices (from its ``__init__``: ``__name__``,
    ``__path__``), which registers the classes they define."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
