"""`python train.py --help` keeps the user's surface of f102334 (the tree before the package's
layout changed): every section, every `--section.field` with its type, default and allowed
values, and every preset. Wording may change; tests/fixtures/help_f102334.json holds what
`help_surface` read from f102334's --help."""
import json
import re
from pathlib import Path

import pytest

from jaxdepth.config.cli import parse_args

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "help_f102334.json"
_FLAG = re.compile(r"^  --(\S+)\s+(\S+)\s+(.*)$")  # flag, type, "default X" or its recipe


def help_surface(text: str) -> dict:
    """{"sections": [...], "flags": {flag: [type, default, sorted choices]}, "presets": [...]}
    read from a --help text."""
    sections, flags, presets, current, words = [], {}, [], None, []

    def close():
        if current is not None:
            described = " ".join(words)
            m = re.search(r"choices: ([^;]*?)(?:;|$)", described)
            choices = sorted(c.strip() for c in m.group(1).split(",")) if m else []
            flags[current[0]] = [current[1], current[2], choices]

    for line in text.splitlines():
        if line.startswith("presets: "):
            presets = sorted(p.strip() for p in line[len("presets: "):].split(","))
        elif (m := _FLAG.match(line)):
            close()
            current, words = (m.group(1), m.group(2), m.group(3).strip()), []
        elif re.match(r"^[a-z_]+: ", line):
            close()
            current = None
            sections.append(line.split(":", 1)[0])
        elif current is not None and line.startswith("      "):
            words.append(line.strip())
    close()
    return {"sections": sections, "flags": flags, "presets": presets}


def test_help_keeps_f102334_s_flags_defaults_choices_and_presets(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--help"])
    assert e.value.code == 0
    now = help_surface(capsys.readouterr().out)
    then = json.loads(FIXTURE.read_text())
    assert now["sections"] == then["sections"]
    assert now["presets"] == then["presets"]
    assert sorted(now["flags"]) == sorted(then["flags"])
    for flag, want in then["flags"].items():
        assert now["flags"][flag] == want, flag
    assert len(then["flags"]) > 100 and "--model.arch" not in then["flags"]  # names as parsed
    assert then["flags"]["model.arch"][2] == ["act", "albert", "bert", "decoder", "encoder"]
