"""``--help``: every section and field with its type, default and what it means (the comment
written beside or just above the field in its section's module, read from the source as
simple-parsing and draccus read theirs, so a field is documented in one place), the choices
and readers its registries hold (jaxdepth/choices.py), and the presets."""
from __future__ import annotations

import dataclasses
import inspect
import io
import re
import textwrap
import tokenize

from ..choices import Choices
from . import RECIPE_FIELDS, SECTIONS
from .presets import presets


def field_docs(cls) -> dict[str, str]:
    """What each field of a config dataclass means: the comment lines just above the field and
    the comment after it on its line, joined ("" for a field without either)."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    docs, above = {}, []
    for line in textwrap.dedent(inspect.getsource(cls)).split("\n")[1:]:
        if line.strip().startswith("#"):
            above.append(line.strip().lstrip("#").strip())
            continue
        m = re.match(r"^    (\w+)\s*:", line)
        if m and m.group(1) in names:
            tokens = tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
            inline = [t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT]
            docs[m.group(1)] = " ".join(above + inline)
        above = []
    return docs


def help_text() -> str:
    lines = ["usage: python train.py [--preset NAME] [--config FILE.json] "
             "[--section.field VALUE ...] [--debug]", "",
             "--debug: print the traceback of an error as well as its one line", ""]
    for sec, cls in SECTIONS.items():
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        lines += textwrap.wrap(f"{sec}: {doc}", 100, subsequent_indent="  ") if doc else [f"{sec}:"]
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            ftype = f.type if isinstance(f.type, str) else f.type.__name__
            shown = ("the run kind's recipe" if sec == "optim" and f.name in RECIPE_FIELDS
                     else f"default {default!r}")
            lines.append(f"  --{sec}.{f.name:<20} {ftype:<6} {shown}")
            # A field whose values or readers are a registry's (jaxdepth/choices.py) lists
            # them as the registry holds them now, so a new choice needs no edit here.
            registry = Choices.of_field(f"{sec}.{f.name}")
            choices = registry.names() if registry else f.metadata.get("allowed")
            readers = [f"read by {field}: " + ", ".join(names)
                       for field, r in sorted(Choices.registries())
                       if (names := r.readers(f"{sec}.{f.name}"))]
            doc = "; ".join(filter(None, [
                docs.get(f.name, ""), "choices: " + ", ".join(choices) if choices else "",
                *readers,
                "may change when a run resumes" if f.metadata.get("resumable") else ""]))
            lines += textwrap.wrap(doc, 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
        lines.append("")
    names = sorted(presets())
    lines.append("presets: " + ", ".join(names))
    return "\n".join(lines)
