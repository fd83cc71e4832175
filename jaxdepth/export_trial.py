"""Export a trial of a run with trials (run.seeds or a trials list) as the single-trial run
directory its solo run would have written (trainer/trials.py: export_trial).

    python -m jaxdepth.export_trial --run runs/seeds --trial 2            # -> runs/seeds/trials/2
    python -m jaxdepth.export_trial --run runs/seeds --trial 2 --out runs/seed2

--out must be a new or empty directory outside the run, or one this same export wrote to
before (its .export.json names the run and trial): rerunning an interrupted (or finished)
export finishes (or refreshes) it, keeping the checkpoints it already wrote. Any other
directory (another run's, the run itself) is refused before anything is written. The run is
only read (but for <run>/trials/<k>, the default destination, where the trial's evaluations
already are).
"""
from __future__ import annotations

from .errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory of a run with trials")
    p.add_argument("--trial", type=int, required=True, help="the trial's index (summary.json)")
    p.add_argument("--out", default="", help="directory to write: new, empty, or this export's "
                   "own (to finish it) (default: <run>/trials/<k>)")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    args = p.parse_args(argv)
    from .errors import run_main

    def body() -> int:
        from .tasks import task_for
        from .trainer.trials import export_trial

        print(export_trial(args.run, args.trial, task_for, args.out or None))
        return 0

    return run_main(body, debug=args.debug)


if __name__ == "__main__":
    from .errors import exit_process

    exit_process(main(sys.argv[1:]))
