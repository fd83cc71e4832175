"""The effective rank of a run's feed-forward matrices (Petty et al., Figs. 10-11;
analysis/rank.py), for any checkpoint of a decoder run:

    python -m jaxdepth.experiments.run_rank --run runs/x [--step N] [--out DIR]
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import sys
from pathlib import Path

from ..analysis.rank import ff_rank_table, write_rank_outputs


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory written by train.py")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--out", default="",
                   help="output directory (default: <run>/analysis/rank_step<N>)")
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    return p.parse_args(argv)


def main(argv) -> int:
    from ..errors import run_main
    args = parse(argv)
    return run_main(lambda: _run(args), debug=args.debug)  # a user's error: one line, exit 2


def _run(args) -> int:
    from ..tasks import load_model
    model, cfg, step = load_model(args.run, args.step)
    rows = ff_rank_table(model)
    out = Path(args.out) if args.out else Path(args.run) / "analysis" / f"rank_step{step}"
    label = f"{Path(args.run).name} step {step} (L={cfg.model.n_layers}, d_ff={cfg.model.d_ff})"
    paths = write_rank_outputs(rows, out, label=label)
    for r in rows:
        print(f"layer {r['layer']:3d} {r['matrix']:5s} erank {r['erank']:9.2f} "
              f"/ {r['max_rank']:5d} = {r['erank_ratio']:.3f}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    from ..errors import exit_process

    exit_process(main(sys.argv[1:]))
