"""What attention costs in a miniature fine-tuning step, and what skipping the cross-example
blocks of packed rows could save (issue 37, item 2; CPU).

    python benchmarks/bench_packed_attention.py --out packed_attention.json

1. Times one layer's attention, forward and backward, at the sweep's fine-tuning shapes
   (32 rows of 192 tokens, 4 heads of 16): the model's own ``attend`` (causal and same-segment
   mask, position bias, float32 softmax), its two matmuls alone, and an exact *banded*
   attention in which a query block of ``--block`` tokens sees only itself and the ``k`` key
   blocks before it, for k = 1 .. T/block - 1.
2. Reads the example lengths of the sweep's packed training rows (passivization and semantic
   parsing, their own configs and tokenizer) and gives, per task, the narrowest band that is
   still exact: a query must see every earlier token of its example, so the band has to
   cover the longest example of the split (k * block >= longest - 1; exact at the real
   positions, which are all that carry loss). One long example is enough to need the full
   width.

The banded attention lives here, not in the library, because the lengths below leave it no
saving on semantic parsing. It is checked against ``attend`` before it is timed.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import arg_parser, environment, median_time, write_json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxdepth.models.layers import attend, same_segment_mask  # noqa: E402


def full_attention(q, k, v, bias_NTT, seg_BT):
    T = q.shape[1]
    mask = jnp.tril(jnp.ones((T, T), bool))[None, None] & same_segment_mask(seg_BT)
    return attend(q, k, v, mask, bias_BNTS=bias_NTT[None])


def banded_attention(q_BTNH, k_BTNH, v_BTNH, bias_NTT, seg_BT, block: int, back: int):
    """``full_attention`` where a query in block i sees only key blocks i-back .. i: exact at
    every real position (segment id > 0) whenever no example is longer than back * block + 1
    tokens. A padding run longer than that differs at its own positions, which carry no loss
    and which no real query attends to. T must be a multiple of ``block``."""
    B, T, N, H = q_BTNH.shape
    nb = T // block

    def band(x, fill):  # [B, T, ...] -> [B, nb, (back + 1) * block, ...]
        pad = jnp.full((B, back * block, *x.shape[2:]), fill, x.dtype)
        xb = jnp.concatenate([pad, x], axis=1).reshape(B, nb + back, block, *x.shape[2:])
        return jnp.concatenate([xb[:, j:j + nb] for j in range(back + 1)], axis=2)

    q = q_BTNH.reshape(B, nb, block, N, H)
    k, v = band(k_BTNH, 0.0), band(v_BTNH, 0.0)
    seg_q, seg_k = seg_BT.reshape(B, nb, block), band(seg_BT, -1)
    q_pos = jnp.arange(T).reshape(nb, block)
    k_pos = (jnp.arange(nb)[:, None] - back) * block + jnp.arange((back + 1) * block)[None]
    mask = ((k_pos[:, None, :] <= q_pos[:, :, None]) & (k_pos[:, None, :] >= 0))[None, :, None]
    mask = mask & (seg_q[:, :, None, :, None] == seg_k[:, :, None, None, :])  # [B,nb,1,b,S]
    bias = bias_NTT[:, q_pos[:, :, None], jnp.clip(k_pos, 0)[:, None, :]]  # [N, nb, b, S]
    logits = jnp.einsum("bitnh,bisnh->bints", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(mask, logits + bias.transpose(1, 0, 2, 3)[None], -1e30)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bints,bisnh->bitnh", probs, v).reshape(B, T, N * H)


def matmuls_only(q, k, v, bias_NTT, seg_BT):
    return jnp.einsum("bnts,bsnh->btnh", jnp.einsum("btnh,bsnh->bnts", q, k), v)


def packed_rows(rows: int, T: int, lengths: np.ndarray, seed: int) -> np.ndarray:
    """Segment ids of rows filled left to right with examples of the given lengths."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((rows, T), np.int32)
    for r in range(rows):
        at, s = 0, 1
        while True:
            n = int(rng.choice(lengths))
            if at + n > T:
                break
            seg[r, at:at + n], at, s = s, at + n, s + 1
    return seg


def task_lengths() -> dict[str, np.ndarray]:
    """Per task, the token length of every example in the sweep's packed training rows."""
    from jaxdepth.data.corpus.prepare import prepare_lm_data
    from jaxdepth.data.finetune.finetune_data import prepare_task_data
    from jaxdepth.experiments.depth_sweep import MINIATURE, Sweep

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sweep = Sweep(tmp, MINIATURE)
        pre = sweep.pretrain_config(4, 0)
        (tmp / "pre").mkdir()
        prepare_lm_data(pre.data, pre.vocab_size, tmp / "pre", True)
        tokenizer = tmp / "pre" / "data" / "tokenizer.model"  # the run's, as prepare writes it
        for task in MINIATURE.tasks:
            cfg = sweep.finetune_config(task, 4, 0, "scratch", 0)
            (tmp / task).mkdir()
            data = prepare_task_data(cfg.task, str(tokenizer), cfg.vocab_size, cfg.data.seq_len,
                                     tmp / task, True, tokenizer_type=cfg.data.tokenizer_type)
            seg = data.train["segment_ids"]
            out[task] = np.concatenate([np.unique(r[r > 0], return_counts=True)[1] for r in seg])
    return out


def main(argv=None) -> int:
    p = arg_parser(__doc__)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=192)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    B, T, N, H, b = args.rows, args.seq_len, args.heads, args.head_dim, args.block
    if T % b:
        raise SystemExit(f"--seq-len {T} is not a multiple of --block {b}")
    lengths = task_lengths()
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v = (jax.random.normal(keys[i], (B, T, N, H)) for i in range(3))
    bias = jax.random.normal(keys[3], (N, T, T))
    # rows of short examples, so that every band below is exact and can be checked
    seg = jnp.asarray(packed_rows(B, T, np.arange(8, b + 2), seed=0))

    def fwd_bwd(fn, **kw):
        grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, bias, seg, **kw) ** 2),
                                argnums=(0, 1, 2)))
        jax.block_until_ready(grad(q, k, v))
        return 1e3 * median_time(lambda: jax.block_until_ready(grad(q, k, v)), args.reps)

    full = fwd_bwd(full_attention)
    record = {"shape": dict(rows=B, seq_len=T, heads=N, head_dim=H, block=b),
              "full_ms": full, "matmuls_only_ms": fwd_bwd(matmuls_only), "banded": []}
    reference = full_attention(q, k, v, bias, seg)
    for back in range(1, T // b):
        got = banded_attention(q, k, v, bias, seg, b, back)
        err = float(jnp.max(jnp.abs(got - reference)))
        if err > 1e-5:
            raise SystemExit(f"banded attention (back={back}) differs from attend by {err:.2e}")
        # the widest band holds every earlier key of a row: exact for any length up to T
        exact = T if back == T // b - 1 else back * b + 1
        record["banded"].append({"keys": (back + 1) * b, "exact_up_to": exact,
                                 "ms": fwd_bwd(banded_attention, block=b, back=back),
                                 "max_abs_diff": err})
    print(f"attention fwd+bwd, one layer, {B} x {T} tokens, {N} heads of {H}: "
          f"full {full:.1f} ms, its matmuls alone {record['matmuls_only_ms']:.1f} ms")
    for r in record["banded"]:
        print(f"  banded, {r['keys']:4d} keys (exact for examples <= {r['exact_up_to']:3d}): "
              f"{r['ms']:.1f} ms ({full / r['ms']:.2f}x)")
    record["tasks"] = {}
    for task, n in lengths.items():
        longest = int(n.max())
        # the narrowest band that is exact for this task (the widest one always is)
        usable = next(r for r in record["banded"] if r["exact_up_to"] >= longest)
        t = record["tasks"][task] = {
            "examples": int(n.size), "longest": longest, "mean": float(n.mean()),
            "p99": float(np.percentile(n, 99)), "exact_band_keys": usable["keys"],
            "exact_band_speedup": full / usable["ms"]}
        print(f"  {task}: {n.size} examples, mean {t['mean']:.1f}, p99 {t['p99']:.0f}, longest "
              f"{longest} tokens -> an exact band needs {usable['keys']} of {T} keys "
              f"({t['exact_band_speedup']:.2f}x on attention)")
    if args.out:
        write_json(args.out, {"benchmark": "packed_attention", **environment(), **record})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
