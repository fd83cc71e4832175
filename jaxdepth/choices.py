"""A registry of the classes that are the values of one config field (fusion.method,
optim.name): a class registers by being defined, and a package of choices imports every
module it holds, so a new choice is a new module and nothing else.

Every registry is found by its field (``Choices.of_field``): the command line lists a field's
choices in --help and checks its value from there (cli.py), whichever package holds the
classes, so neither names a registry field by field."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, ClassVar, Generic, Iterable, TypeVar

from .errors import ConfigError

C = TypeVar("C", bound=type)


class Choices(Generic[C]):
    _of_field: dict[str, "Choices"] = {}  # every registry, by the field it gives values to

    def __init__(self, what: str, field: str, order: Callable[[C], object] = lambda c: 0):
        self.what, self.field, self.order = what, field, order
        self._by_name: dict[str, C] = {}
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
        """The choice called ``name``; a ConfigError naming the field for any other name."""
        if name not in self._by_name:
            raise ConfigError(f"{self.field}: must be one of {', '.join(self.names())}, "
                              f"got {name!r}", field=self.field)
        return self._by_name[name]

    def names(self) -> tuple[str, ...]:
        """Every choice's name, ordered by ``order`` then name."""
        return tuple(sorted(self._by_name, key=lambda n: (self.order(self._by_name[n]), n)))

    def readers(self, setting: str) -> tuple[str, ...]:
        """The choices that declare ``setting`` (a field of the section of this registry's
        field, by name) one that only they read, in their ``SETTINGS``; () when none does."""
        return tuple(n for n in self.names() if setting in getattr(self._by_name[n], "SETTINGS", ()))


class Registered:
    """A base for a field's choice classes: a subclass that defines a ``NAME`` registers
    itself in ``REGISTRY``, its field's Choices."""

    REGISTRY: ClassVar[Choices]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "NAME" in cls.__dict__:
            cls.REGISTRY.add(cls)


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module of a package of choices (from its ``__init__``: ``__name__``,
    ``__path__``), which registers the classes they define."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")
