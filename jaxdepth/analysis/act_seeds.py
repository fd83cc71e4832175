"""ACT's Table 1 over seeds: each group's mean number of updates N with a 95% t-interval over
the seeds, not over the tokens (docs/act.md).

A token-level interval treats the tokens of one run as independent draws, so it says how well
one trained model's mean is measured, not how another seed's model would behave. Here each
seed's run contributes one value per group (its mean N over the validation tokens), and the
interval is the t-interval of those values. A group's difference from all tokens is taken
within each seed first (paired), which removes what moves every group of a seed together.

    python -m jaxdepth.analysis.act_seeds runs/act-cpu-5 [more runs] --out runs/act-cpu-5/report

Each run is a trials run (every ``trials/<k>/analysis/table1.json``) or a solo run
(``analysis/table1.json``), as ``train.py`` writes them at its end.
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ..errors import DataError
from .act_stats import GROUPS
from .exact_match import mean_ci95


def table1_files(run: Path) -> list[Path]:
    """The final Table 1 of each seed of one run: its trials' in trial order, else its own."""
    trials = sorted((p for p in (run / "trials").glob("*/analysis/table1.json")
                     if p.parent.parent.name.isdigit()),
                    key=lambda p: int(p.parent.parent.name))
    own = run / "analysis" / "table1.json"
    found = trials or ([own] if own.is_file() else [])
    if not found:
        raise DataError(f"{run}: no analysis/table1.json (a finished ACT pretraining run "
                        f"writes one, each trial in trials/<k>/)")
    return found


def read_table1(path: Path) -> dict:
    """A run's final Table 1, with the numbers this module reads present."""
    try:
        t = json.loads(path.read_text())["table1"]
        numbers = [t["mlm_accuracy"], t["sop_accuracy"], t["iterations"]["all"]]
        if not all(isinstance(x, (int, float)) for x in numbers):
            raise ValueError("no MLM/SOP accuracy or mean iterations (nothing was scored)")
        return t
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path}: not a Table 1 written by train.py ({e!r})") from None


def seed_table(tables: Sequence[dict]) -> dict:
    """Across seeds (one ``table1`` dict each): MLM and SOP accuracy and each group's mean N as
    {"mean", "ci95", "seeds"}; each group's paired difference from all tokens likewise; the
    tokens per group (equal across seeds when they scored the same batches, else a list)."""
    if len(tables) < 2:
        raise DataError(f"an interval over seeds needs at least 2 runs, got {len(tables)}")

    def summary(values: list[float]) -> dict:
        mean, half = mean_ci95(values)
        return {"mean": mean, "ci95": half, "seeds": values}

    out = {"seeds": len(tables),
           "mlm_accuracy": summary([t["mlm_accuracy"] for t in tables]),
           "sop_accuracy": summary([t["sop_accuracy"] for t in tables]),
           "iterations": {}, "minus_all": {}, "tokens": {}}
    for g in GROUPS:
        if any(t["iterations"][g] is None for t in tables):
            continue  # a group some seed never saw
        values = [t["iterations"][g] for t in tables]
        out["iterations"][g] = summary(values)
        if g != "all":
            out["minus_all"][g] = summary([v - t["iterations"]["all"]
                                           for v, t in zip(values, tables)])
        counts = sorted({t["tokens"][g] for t in tables})
        out["tokens"][g] = counts[0] if len(counts) == 1 else [t["tokens"][g] for t in tables]
    return out


def format_seed_table(table: dict) -> str:
    """Markdown: one row per group; mean N ± 95% interval over the seeds, the paired
    difference from all tokens, and each seed's value."""
    n = table["seeds"]

    def pm(s: dict, spec: str, scale: float = 1.0, sign: str = "") -> str:
        return f"{format(scale * s['mean'], sign + spec)} ± {format(scale * s['ci95'], spec)}"

    lines = [f"MLM accuracy {pm(table['mlm_accuracy'], '.1f', 100)}%, SOP accuracy "
             f"{pm(table['sop_accuracy'], '.1f', 100)}% (mean ± 95% t-interval over {n} seeds).",
             "", "| group | tokens | mean N | minus all tokens (paired) | each seed |",
             "| --- | ---: | ---: | ---: | --- |"]
    for g, s in table["iterations"].items():
        diff = table["minus_all"].get(g)
        lines.append(f"| {g} | {table['tokens'][g]} | {pm(s, '.3f')} | "
                     f"{'' if diff is None else pm(diff, '.3f', sign='+')} | "
                     f"{', '.join(format(v, '.3f') for v in s['seeds'])} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from ..errors import run_main
    p = argparse.ArgumentParser(prog="python -m jaxdepth.analysis.act_seeds",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="ACT pretraining run directories")
    p.add_argument("--out", type=Path, help="directory for table1_seeds.md and .json")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    args = p.parse_args(argv)
    return run_main(lambda: _run(args), debug=args.debug)  # a user's error: one line, exit 2


def _run(args) -> int:
    files = [f for run in args.runs for f in table1_files(run)]
    seen = {}
    for f in files:
        if f.resolve() in seen:
            raise DataError(f"{f}: given twice (also as {seen[f.resolve()]}); each seed counts "
                            f"once")
        seen[f.resolve()] = f
    table = seed_table([read_table1(f) for f in files])
    text = format_seed_table(table)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table1_seeds.md").write_text(text)
        (args.out / "table1_seeds.json").write_text(
            json.dumps({**table, "files": [str(f) for f in files]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from ..errors import exit_process

    exit_process(main(sys.argv[1:]))
