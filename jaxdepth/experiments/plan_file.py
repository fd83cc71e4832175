"""An experiment directory's plan file: written by the first command, checked by every later one."""
from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from ..config import ConfigError


def open_plan(out: Path, name: str, plan, plan_cls, start: str = "run"):
    """The plan saved as out/name. A given `plan` must equal it (a different plan for the same
    directory is refused, naming the first differing field); with none saved, `plan` is written
    (and None is an error: nothing was started there)."""
    path = out / name
    if path.is_file():
        saved = plan_cls.from_json(json.loads(path.read_text()))
        if plan is not None and plan != saved:
            diff = [k for k, v in plan.to_json().items() if saved.to_json()[k] != v]
            raise ConfigError(f"{diff[0]}: {out} holds an experiment with another plan "
                              f"(differs in {', '.join(diff)}); use another --out")
        return saved
    if plan is None:
        raise FileNotFoundError(f"no experiment in {out} (expected {path}); start it with `{start}`")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=2))
    return plan


class PlannedExperiment:
    """An experiment directory: its plan (``PLAN_FILE``, a ``PLAN`` saved by the first command
    and checked by every later one) and the results.jsonl its units append to."""

    PLAN: ClassVar[type]  # each experiment names its plan dataclass
    PLAN_FILE: ClassVar[str] = "plan.json"
    # One program per unit (--sequential), as before trials; by default the units that differ
    # only in seeds and data train as trials of one program (trainer/trials.py).
    sequential: bool = False

    def __init__(self, out: Path, plan):
        self.out, self.plan = out, plan
        self.results = out / "results.jsonl"
        self.units_run = 0  # trained by this process (a rerun of a finished one trains none)

    @classmethod
    def open(cls, out: Path, plan):
        return cls(out, open_plan(out, cls.PLAN_FILE, plan, cls.PLAN))
