"""The DWAtt paper's Table 2: parameters each fusion method adds on a backbone
(analysis/fusion_params.py), for a backbone given by a source or by its sizes.

    python -m jaxdepth.experiments.table2 --backbone DIR      # HF directory or a run
    python -m jaxdepth.experiments.table2 --layers 12 --d-model 768
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import sys

import equinox as eqx
import jax

from ..analysis.fusion_params import markdown, param_table
from ..config import Config, apply_overrides


def abstract_backbone(source: str, layers: int, d_model: int, heads: int, vocab: int):
    """The backbone a source describes, shapes only (nothing is allocated or read but configs)."""
    from ..tasks.backbones import build_backbone
    over = {"task": {"init_from": source}} if source else {
        "model": {"arch": "encoder", "n_layers": layers, "d_model": d_model, "n_heads": heads,
                  "d_ff": 4 * d_model, "vocab_size": vocab}, "data": {"seq_len": 512}}
    cfg = apply_overrides(Config(), over)
    return eqx.filter_eval_shape(build_backbone, cfg, key=jax.random.key(0))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxdepth.experiments.table2",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="", help="HF directory or run of this project")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--extra-layers", type=int, default=1)
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        bb = abstract_backbone(a.backbone, a.layers, a.d_model, a.heads, a.vocab)
        print(markdown(param_table(bb, a.extra_layers)), end="")
        return 0

    from ..errors import run_main
    return run_main(body, debug=a.debug)  # a user's error: one line, exit 2


if __name__ == "__main__":
    from ..errors import exit_process

    exit_process(main())
