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

    def train_as_trials(self, what: str, cfg, units: list) -> list[dict]:
        """Train cfg, a run with trials, whose trial k must be exactly the solo run units[k]
        (a Config; else a ConfigError saying to give --sequential); export every trial to its
        unit's run directory (trainer/trial_export.py) and return each trial's summary as its
        solo run's would read (the run's figures with the trial's entry over them)."""
        import dataclasses
        import time

        from ..config import ConfigError
        from ..trial_grid import trial_configs
        from ..errors import RunFailed
        from ..tasks import task_for
        from ..trainer.loop import train
        from ..trainer.trial_export import export_trial

        cfgs = trial_configs(cfg)
        for k, (c, unit) in enumerate(zip(cfgs, units)):
            if dataclasses.replace(c, run=dataclasses.replace(c.run, dir=unit.run.dir)) != unit:
                raise ConfigError(f"{what}: trial {k} would differ from its unit's run "
                                  f"({unit.run.dir}); give --sequential")
        self.units_run += len(units)
        t0 = time.perf_counter()
        print(f"{what}: {len(units)} units as trials of one program ...", flush=True)
        s = train(cfg, [task_for(c) for c in cfgs])
        if not s.get("done"):
            raise RunFailed(f"{what} stopped at step {s['step']} before the end; run the "
                            f"command again to resume")
        print(f"{what}: done in {time.perf_counter() - t0:.0f} s", flush=True)
        out = []
        for k, unit in enumerate(units):
            export_trial(cfg.run.dir, k, task_for, unit.run.dir)
            out.append({**s, **{n: v for n, v in s["trials"][k].items() if n != "trial"}})
        return out

    @classmethod
    def open(cls, out: Path, plan):
        return cls(out, open_plan(out, cls.PLAN_FILE, plan, cls.PLAN))
