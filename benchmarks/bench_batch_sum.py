"""The shared position bias's gradient: XLA:CPU's sum over the batch against shared_over_batch's.

The decoder adds one [N, T, S] bias to every example's logits, so its gradient sums the
batch's [B, N, T, S] slices. jax 0.10's XLA:CPU gives that reduction to YNNPACK;
``jaxdepth.models.layers.shared_over_batch`` adds the slices one after the other instead. Per
shape (the decoder's: B examples, N heads, T = S positions) this times both, each jitted
alone (median of ``--reps``), and says whether they agree bit for bit (where they do not,
taking the adds changed a run's last bits). ``--trials K`` runs both under a vmap over K
trials as well. The threads are the environment's: ``taskset -c 0`` and XLA_FLAGS
``--xla_cpu_multi_thread_eigen=false`` for one, as the sweep's pinned workers run.

    python benchmarks/bench_batch_sum.py --out benchmarks/results/batch_sum_<machine>.json
"""
from __future__ import annotations

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import arg_parser, environment, median_time, write_json

import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.models.layers import shared_over_batch

SHAPES = [(32, 2, 128, 128), (64, 2, 128, 128), (32, 4, 128, 128), (32, 8, 128, 128),
          (32, 4, 192, 192), (16, 4, 256, 256), (8, 8, 256, 256), (4, 8, 512, 512),
          (8, 8, 512, 512), (16, 8, 512, 512), (8, 12, 512, 512)]


def measure(g, vmapped: bool, reps: int) -> dict:
    """Both sums of g ([B, ...], or [K, B, ...] when vmapped): ms each, bit-equal or not."""
    B = g.shape[1] if vmapped else g.shape[0]

    def adds(g):
        x = jnp.zeros(g.shape[1:], g.dtype)
        return jax.vjp(lambda x: shared_over_batch(x, B), x)[1](g)[0]

    def reduce(g):
        return jnp.sum(g, 0)

    fns = {n: jax.jit(jax.vmap(f) if vmapped else f) for n, f in
           (("reduce", reduce), ("adds", adds))}
    out = {n: np.asarray(f(g)) for n, f in fns.items()}
    row = {f"{n}_ms": 1e3 * median_time(lambda f=f: jax.block_until_ready(f(g)), reps)
           for n, f in fns.items()}
    row["bit_equal"] = bool(np.array_equal(out["reduce"], out["adds"]))
    return row


def main():
    p = arg_parser(__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--trials", type=int, default=5, help="K of the vmapped rows (0: none)")
    p.add_argument("--out", default="batch_sum.json")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for shape in SHAPES:
        for k in ([0, args.trials] if args.trials else [0]):
            full = ((k,) if k else ()) + shape
            scale = 10.0 ** rng.integers(-3, 4, full[:len(full) - 3] + (1, 1, 1))
            g = jnp.asarray((rng.standard_normal(full) * scale).astype(np.float32))
            row = {"shape_BNTS": list(shape), "trials": k, "sums": int(np.prod(shape[1:])),
                   **measure(g, bool(k), args.reps)}
            rows.append(row)
            print(f"{str(shape):20s} trials {k}: reduce {row['reduce_ms']:8.2f} ms, adds "
                  f"{row['adds_ms']:7.2f} ms, bit-equal {row['bit_equal']}", flush=True)
            del g
    write_json(args.out, {"benchmark": "bench_batch_sum", "reps": args.reps,
                          "xla_flags": os.environ.get("XLA_FLAGS", ""),
                          **environment(), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
