"""Train (or resume) a jaxdepth model: ``python -m jaxdepth.train --help`` (also
``jaxdepth-train``, or ``python train.py`` in a checkout) lists every field."""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from jaxdepth.errors import run_main

    return run_main(lambda: _train(argv), debug="--debug" in argv)


def _train(argv: list[str]) -> int:
    from jaxdepth.config.cli import parse_args, preset_lines

    cfg = parse_args(argv)
    import jax

    from jaxdepth.trainer.processes import start

    start(cfg.mesh)  # before anything runs on a device: every process joins the run
    lines = preset_lines(cfg)  # what the preset and the run kind's recipe set
    if jax.process_index() == 0 and lines:
        print("\n".join(lines))

    from jaxdepth.tasks.summary_text import summary_text
    from jaxdepth.tasks.registry import train

    summary = train(cfg)  # one task per trial if it has trials (trainer/trials.py)
    if jax.process_index() == 0:
        print(summary_text(summary))
    return 0


def command() -> None:
    """The command (``python -m jaxdepth.train``, ``jaxdepth-train``, train.py): the process
    is its own."""
    from jaxdepth.errors import exit_process, quiet_interrupts
    from jaxdepth.trainer.runtime import tune_malloc

    quiet_interrupts()  # a Ctrl-C while jax is imported: one line, not a traceback
    tune_malloc()  # the process is ours: before jax allocates anything
    exit_process(main(sys.argv[1:]))


if __name__ == "__main__":
    command()
