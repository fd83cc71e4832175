"""The fused LM head's shapes and operand layouts on the CPU, each measured alone (issue 51).

The 41M step's output projection and loss (``tasks/losses.py:fused_lm_head_loss``: N = 4096
tokens of D = 512 against V = 32128) is three dots per chunk of tokens: the logits x @ w, the
input gradient g @ w^T and the weight gradient x^T @ g. This times, each jitted alone (median
of ``--reps``):

- the whole head, forward and backward, at ``--chunks`` tokens per chunk;
- each dot of a 2048-token chunk as the head writes it, and in the other operand layout XLA
  could be given: the input gradient against a weight transposed once beforehand ([V, D], so
  the dot contracts its major axis), the weight gradient as g^T @ x ([V, D], transposed back
  once per step), with whether each equals the head's own dot bit for bit.

    python benchmarks/bench_lm_head.py --out benchmarks/results/lm_head_<machine>.json
"""
from __future__ import annotations

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import arg_parser, environment, median_time, write_json

import jax
import jax.numpy as jnp
import numpy as np

from jaxdepth.tasks.losses import fused_lm_head_loss


def head_ms(x, w, t, wt, chunk: int, reps: int) -> float:
    f = jax.jit(jax.value_and_grad(lambda x, w: fused_lm_head_loss(x, w, t, wt, 0.0, chunk)[0],
                                   argnums=(0, 1)))
    return 1e3 * median_time(lambda: jax.block_until_ready(f(x, w)), reps)


def dots(x_CD, w_DV, g_CV, reps: int) -> dict:
    """ms of each dot of one chunk as the head writes it and in the other layout."""
    w_VD = jnp.asarray(np.ascontiguousarray(np.asarray(w_DV).T))
    cases = {
        "logits x @ w": (lambda x, w: jnp.dot(x, w), (x_CD, w_DV)),
        "input grad g @ w.T (head)": (lambda g, w: jnp.dot(g, w.T), (g_CV, w_DV)),
        "input grad g @ w_VD (w transposed once)": (lambda g, w: jnp.dot(g, w), (g_CV, w_VD)),
        "weight grad x.T @ g (head)": (lambda x, g: jnp.dot(x.T, g), (x_CD, g_CV)),
        "weight grad (g.T @ x).T": (lambda x, g: jnp.dot(g.T, x).T, (x_CD, g_CV)),
    }
    out, values = {}, {}
    for name, (fn, args) in cases.items():
        f = jax.jit(fn)
        values[name] = np.asarray(f(*args))
        out[name] = {"ms": 1e3 * median_time(lambda f=f, a=args: jax.block_until_ready(f(*a)),
                                             reps)}
    pairs = {"input grad g @ w_VD (w transposed once)": "input grad g @ w.T (head)",
             "weight grad (g.T @ x).T": "weight grad x.T @ g (head)"}
    for name, head in pairs.items():
        out[name]["bit_equal_head"] = bool(np.array_equal(values[name], values[head]))
    return out


def main():
    p = arg_parser(__doc__)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32128)
    p.add_argument("--chunks", default="512,1024,2048,4096")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default="lm_head.json")
    args = p.parse_args()
    N, D, V = args.tokens, args.d_model, args.vocab
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((N, D), np.float32) * 0.5)
    w = jnp.asarray(rng.standard_normal((D, V), np.float32) * 0.04)
    t = jnp.asarray(rng.integers(0, V, N).astype(np.int32))
    wt = jnp.ones((N,), jnp.float32)
    head = {}
    for c in [int(c) for c in args.chunks.split(",")]:
        head[c] = head_ms(x, w, t, wt, c, args.reps)
        print(f"head fwd+bwd, chunk {c}: {head[c]:.0f} ms", flush=True)
    g = jnp.asarray(rng.standard_normal((2048, V), np.float32) * 1e-3)
    per_dot = dots(x[:2048], w, g, args.reps)
    flops = 2 * 2048 * D * V
    for name, r in per_dot.items():
        r["gflop_s"] = flops / r["ms"] / 1e6
        print(f"{name:42s} {r['ms']:7.1f} ms {r['gflop_s']:6.1f} GFLOP/s"
              + (f"  bit-equal to the head's: {r['bit_equal_head']}" if "bit_equal_head" in r
                 else ""), flush=True)
    write_json(args.out, {"benchmark": "bench_lm_head", "tokens": N, "d_model": D, "vocab": V,
                          "reps": args.reps, **environment(),
                          "head_fwd_bwd_ms_by_chunk": head, "dots_of_a_2048_chunk": per_dot})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
