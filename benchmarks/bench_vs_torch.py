"""jaxdepth's train step against the same model and step written plainly in PyTorch.

The PyTorch side is a from-scratch T5.1.1 decoder-only LM (docs/design.md §2): pre-RMSNorm, no
biases, gated-GELU (tanh) MLP, causal T5 relative position bias (32 buckets, max distance 128)
shared by all layers, untied embedding / output projection, query kernel scaled at init;
AdamW (no decay on norm scales, as ``jaxdepth.models.declared.decay_mask``), global-norm clipping
1.0, cross-entropy over the full vocabulary. It starts from jaxdepth's initial weights (copied),
so both sides train the same model on the same batch and their first losses must agree.

Three contestants run in ONE process, alternating blocks of steps (jax, torch eager,
torch.compile, repeat) so that machine noise hits all of them alike:

- ``jax``: the real train step (trainer/state.py's ``start``: one trial on its trial axis);
- ``torch_eager``: forward, ``backward()``, ``clip_grad_norm_``, ``AdamW.step()``;
- ``torch_compile``: the same with the forward + loss under ``torch.compile`` (its failure is
  caught and reported; ``--no-compile`` skips it).

Threads: ``torch.set_num_threads(os.cpu_count())``; XLA:CPU uses every core by default.
``--profile`` then times the pieces of one step on both sides (forward, forward+backward,
attention / MLP sublayers, LM head matmul, cross-entropy over the vocabulary, optimizer
update) to show where the time goes.

    python benchmarks/bench_vs_torch.py                 # 41M baseline: 2 layers, T=512, B=8
    python benchmarks/bench_vs_torch.py --quick         # T=128, B=2: seconds, for smoke tests
    python benchmarks/bench_vs_torch.py --preset 41M-L4 --seq-len 256 --profile --out r.json
    python benchmarks/bench_vs_torch.py --alone        # the control: each in its own process
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import (TrainStep, arg_parser, environment, median_time as _time, random_lm_batch,
                    timed, write_json)

import jax
import jax.numpy as jnp
import numpy as np

import equinox as eqx

from jaxdepth.config import Config, DataConfig, MeshConfig, ModelConfig, OptimConfig, RunConfig
from jaxdepth.models.depth_family import param_count
from jaxdepth.config.presets import from_preset
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.tasks.losses import lm_loss_sums
from jaxdepth.models.flops import train_flops_per_token
from jaxdepth.trainer.metrics import measure_matmul_peak
from jaxdepth.optim import make_optimizer

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the jax side and the tests that skip still import this module
    torch = None


# ============================================================================ PyTorch model

if torch is not None:

    def t5_bucket(rel_pos: "torch.Tensor", n_buckets: int, max_distance: int) -> "torch.Tensor":
        """T5 causal bucket of rel_pos = key - query (float32 log, truncation, as T5/jaxdepth)."""
        n = torch.clamp(-rel_pos, min=0)
        max_exact = n_buckets // 2
        nf = n.to(torch.float32) / max_exact + torch.finfo(torch.float32).eps
        scale = (n_buckets - max_exact) / math.log(max_distance / max_exact)
        large = max_exact + (torch.log(nf) * scale).to(torch.int64)
        large = torch.clamp(large, max=n_buckets - 1)
        return torch.where(n < max_exact, n, large)

    def _kernel(fan_in: int, *shape: int) -> "torch.nn.Parameter":
        """variance_scaling(1.0, fan_in, 'normal'): truncated normal at 2 sigma, as jax/t5x."""
        std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
        w = torch.empty(*shape)
        torch.nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
        return torch.nn.Parameter(w)

    def rms_norm(x: "torch.Tensor", scale: "torch.Tensor", eps: float = 1e-6) -> "torch.Tensor":
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * scale).to(x.dtype)

    class TorchBlock(torch.nn.Module):
        """x + Attn(RMSNorm(x)); x + MLP(RMSNorm(x)). Kernels are [in, out]: y = x @ W."""

        def __init__(self, d_model: int, d_ff: int, n_heads: int, attn_impl: str = "sdpa"):
            super().__init__()
            h = d_model // n_heads
            self.n_heads, self.attn_impl = n_heads, attn_impl
            self.attn_norm = torch.nn.Parameter(torch.ones(d_model))
            self.wq = torch.nn.Parameter(_kernel(d_model, d_model, d_model).data / math.sqrt(h))
            self.wk = _kernel(d_model, d_model, d_model)
            self.wv = _kernel(d_model, d_model, d_model)
            self.wo = _kernel(d_model, d_model, d_model)
            self.mlp_norm = torch.nn.Parameter(torch.ones(d_model))
            self.wi_0 = _kernel(d_model, d_model, d_ff)
            self.wi_1 = _kernel(d_model, d_model, d_ff)
            self.wo_ff = _kernel(d_ff, d_ff, d_model)

        def attention(self, x, bias_1NTT):
            B, T, D = x.shape
            heads = lambda y: y.view(B, T, self.n_heads, -1).transpose(1, 2)  # noqa: E731
            q, k, v = heads(x @ self.wq), heads(x @ self.wk), heads(x @ self.wv)
            if self.attn_impl == "sdpa":  # bias_1NTT already holds -inf above the diagonal
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias_1NTT, scale=1.0)
            else:  # "math": the textbook formulation
                s = torch.einsum("bnth,bnsh->bnts", q, k).float() + bias_1NTT
                o = torch.einsum("bnts,bnsh->bnth", torch.softmax(s, -1).to(v.dtype), v)
            return o.transpose(1, 2).reshape(B, T, D) @ self.wo

        def mlp(self, x):
            return (F.gelu(x @ self.wi_0, approximate="tanh") * (x @ self.wi_1)) @ self.wo_ff

        def forward(self, x, bias_1NTT):
            x = x + self.attention(rms_norm(x, self.attn_norm), bias_1NTT)
            return x + self.mlp(rms_norm(x, self.mlp_norm))

    class TorchDecoderLM(torch.nn.Module):
        """T5.1.1 decoder-only LM, the same architecture as jaxdepth.models.decoder.DecoderLM."""

        def __init__(self, m: ModelConfig, attn_impl: str = "sdpa"):
            super().__init__()
            self.cfg = m
            self.embed = torch.nn.Parameter(torch.randn(m.vocab_size, m.d_model))
            lim = math.sqrt(6.0 / (m.rel_buckets + m.heads))  # variance_scaling fan_avg uniform
            self.rel_table = torch.nn.Parameter(torch.empty(m.rel_buckets, m.heads).uniform_(-lim, lim))
            self.blocks = torch.nn.ModuleList(
                TorchBlock(m.d_model, m.d_ff, m.heads, attn_impl) for _ in range(m.n_layers))
            self.final_norm = torch.nn.Parameter(torch.ones(m.d_model))
            self.lm_head = _kernel(m.d_model, m.d_model, m.vocab_size)

        def position_bias(self, T: int, device) -> "torch.Tensor":
            """[1, N, T, T] relative-position bias with -inf on future keys (causal mask)."""
            pos = torch.arange(T, device=device)
            buckets = t5_bucket(pos[None, :] - pos[:, None], self.cfg.rel_buckets,
                                self.cfg.rel_max_distance)
            bias = self.rel_table[buckets].permute(2, 0, 1)  # [N, T, S]
            causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
            return bias.masked_fill(~causal, float("-inf"))[None]

        def forward(self, tokens):
            x = self.embed[tokens]
            bias = self.position_bias(tokens.shape[1], tokens.device)
            for blk in self.blocks:
                x = blk(x, bias)
            return rms_norm(x, self.final_norm).float() @ self.lm_head.float()  # [B, T, V] fp32

        @torch.no_grad()
        def load_jax(self, model: DecoderLM) -> "TorchDecoderLM":
            """Copy a jaxdepth DecoderLM's weights (stacked layers [L, ...]) into this module."""
            t = lambda a: torch.from_numpy(np.array(a, np.float32))  # noqa: E731
            self.embed.copy_(t(model.embed))
            self.rel_table.copy_(t(model.rel_bias.table))
            self.final_norm.copy_(t(model.final_norm.scale))
            self.lm_head.copy_(t(model.lm_head))
            b = model.blocks
            for i, blk in enumerate(self.blocks):
                blk.attn_norm.copy_(t(b.attn_norm.scale[i]))
                blk.mlp_norm.copy_(t(b.mlp_norm.scale[i]))
                for name in ("wq", "wk", "wv", "wo"):
                    getattr(blk, name).copy_(t(getattr(b.attn, name)[i]))
                blk.wi_0.copy_(t(b.mlp.wi_0[i]))
                blk.wi_1.copy_(t(b.mlp.wi_1[i]))
                blk.wo_ff.copy_(t(b.mlp.wo[i]))
            return self

    def torch_loss(model, inputs, targets, weights):
        """Mean NLL over weighted tokens (the jax step divides the NLL sum by the weight sum)."""
        logits = model(inputs)
        nll = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                              reduction="none")
        return (nll * weights.reshape(-1)).sum() / weights.sum()

    def torch_optimizer(model, o: OptimConfig, impl: str = "fused"):
        """AdamW with optax's hyper-parameters; no weight decay on norm scales (decay_mask).

        impl: "fused" (one kernel per parameter; by far the fastest on CPU), "foreach" or
        "default" (torch's default on CPU: a Python loop of per-tensor ops).
        """
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (no_decay if "norm" in name else decay).append(p)
        kw = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[impl]
        return torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=o.lr, betas=(o.b1, o.b2), eps=o.eps, **kw)

    def make_torch_step(model, opt, clip_norm: float, loss_fn=torch_loss):
        def step(inputs, targets, weights):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model, inputs, targets, weights)
            loss.backward()
            if clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            opt.step()
            return loss.detach()
        return step


# ============================================================================ shared setup

def bench_config(model: ModelConfig, seq_len: int, batch: int) -> Config:
    """AdamW with a constant lr (the schedule is irrelevant to speed and easy to match)."""
    optim = OptimConfig(name="adamw", lr=1e-3, schedule="constant", warmup_steps=0)
    return Config(model=model, data=DataConfig(seq_len=seq_len, batch_size=batch), optim=optim,
                  mesh=MeshConfig(data=1), run=RunConfig(steps=1000))


class JaxSide(TrainStep):
    """The real jaxdepth train step, as train.py builds it (on one device)."""

    def __init__(self, cfg: Config, batch: dict):
        super().__init__(cfg, batch)
        self.initial_model = jax.tree.map(lambda x: np.array(x) if eqx.is_array(x) else x,
                                          self.state.models().one(0))

    def step(self) -> float:
        jax.block_until_ready(self())
        return self.loss()


class TorchSide:
    def __init__(self, cfg: Config, batch: dict, init: DecoderLM, compiled: bool,
                 attn_impl: str, device: str, adamw: str = "fused"):
        self.device = device
        self.model = TorchDecoderLM(cfg.model, attn_impl).load_jax(init).to(device)
        self.opt = torch_optimizer(self.model, cfg.optim, adamw)
        loss_fn = torch.compile(torch_loss) if compiled else torch_loss
        self.step_fn = make_torch_step(self.model, self.opt, cfg.optim.clip_norm, loss_fn)
        tb = lambda a, dt: torch.from_numpy(np.asarray(a)).to(device=device, dtype=dt)  # noqa: E731
        self.batch = (tb(batch["inputs"], torch.long), tb(batch["targets"], torch.long),
                      tb(batch["weights"], torch.float32))

    def step(self) -> float:
        loss = self.step_fn(*self.batch)
        if self.device != "cpu":
            torch.cuda.synchronize()
        return float(loss)


# ============================================================================ profiling

def profile_jax(cfg: Config, batch: dict, reps: int = 3) -> dict:
    """Seconds of each piece of a jaxdepth train step, each jitted on its own (fwd+bwd)."""
    m = cfg.model
    model = DecoderLM(m, key=jax.random.key(0))
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    params = eqx.filter(model, eqx.is_array)
    opt_state = tx.init(params)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    B, T = b["inputs"].shape
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((B, T, m.d_model), np.float32))
    ct = jnp.asarray(rng.standard_normal((B, T, m.d_model), np.float32))
    logits = jnp.asarray(rng.standard_normal((B, T, m.vocab_size), np.float32))
    pos = jnp.arange(T)
    bias = model.rel_bias(pos, pos)
    block0 = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, model.blocks)
    run = lambda f, *a: (lambda: jax.block_until_ready(f(*a)))  # noqa: E731

    def loss(mdl, bb):
        return lm_loss_sums(mdl(bb["inputs"]), bb["targets"], bb["weights"])[0]

    fwd = eqx.filter_jit(loss)
    fwd_bwd = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    _, grads = fwd_bwd(model, b)
    update = eqx.filter_jit(lambda g, s, p: eqx.apply_updates(p, tx.update(g, s, p)[0]))
    attn = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda blk, x: jnp.vdot(blk.attn(blk.attn_norm(x), bias), ct)))
    mlp = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda blk, x: jnp.vdot(blk.mlp(blk.mlp_norm(x)), ct)))
    head = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda w, x: jnp.vdot(jnp.einsum("btd,dv->btv", x, w), logits)))
    xent = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda lg: lm_loss_sums(lg, b["targets"], b["weights"])[0]))
    xent_fwd = eqx.filter_jit(lambda lg: lm_loss_sums(lg, b["targets"], b["weights"])[0])
    return {
        "forward_loss": _time(run(fwd, model, b), reps),
        "forward_backward": _time(run(fwd_bwd, model, b), reps),
        "optimizer_update": _time(run(update, grads, opt_state, params), reps),
        "attention_sublayer_fwd_bwd_x_layers": m.n_layers * _time(run(attn, block0, x), reps),
        "mlp_sublayer_fwd_bwd_x_layers": m.n_layers * _time(run(mlp, block0, x), reps),
        "lm_head_matmul_fwd_bwd": _time(run(head, model.lm_head, x), reps),
        "cross_entropy_fwd_bwd": _time(run(xent, logits), reps),
        "cross_entropy_fwd": _time(run(xent_fwd, logits), reps),
    }


def profile_torch(cfg: Config, batch: dict, attn_impl: str, adamw: str = "fused",
                  reps: int = 3) -> dict:
    """The same pieces, eager PyTorch."""
    m = cfg.model
    model = TorchDecoderLM(m, attn_impl)
    opt = torch_optimizer(model, cfg.optim, adamw)
    tb = lambda a, dt: torch.from_numpy(np.asarray(a)).to(dtype=dt)  # noqa: E731
    inp, tgt, w = (tb(batch["inputs"], torch.long), tb(batch["targets"], torch.long),
                   tb(batch["weights"], torch.float32))
    B, T = inp.shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, m.d_model, generator=g, requires_grad=True)
    ct = torch.randn(B, T, m.d_model, generator=g)
    lg_ct = torch.randn(B, T, m.vocab_size, generator=g)
    logits = torch.randn(B, T, m.vocab_size, generator=g, requires_grad=True)
    blk = model.blocks[0]
    bias = model.position_bias(T, "cpu").detach()

    def nll(lg):
        out = F.cross_entropy(lg.view(-1, lg.shape[-1]), tgt.reshape(-1), reduction="none")
        return (out * w.reshape(-1)).sum()

    def bwd(f):
        def go():
            model.zero_grad(set_to_none=True)
            x.grad = logits.grad = None
            f().backward()
        return go

    def fwd():
        with torch.no_grad():
            torch_loss(model, inp, tgt, w)

    torch_loss(model, inp, tgt, w).backward()  # grads for the optimizer timing
    return {
        "forward_loss": _time(fwd, reps),
        "forward_backward": _time(bwd(lambda: torch_loss(model, inp, tgt, w)), reps),
        "optimizer_update": _time(lambda: (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0),
                                           opt.step()), reps),
        "attention_sublayer_fwd_bwd_x_layers": m.n_layers * _time(
            bwd(lambda: (blk.attention(rms_norm(x, blk.attn_norm), bias) * ct).sum()), reps),
        "mlp_sublayer_fwd_bwd_x_layers": m.n_layers * _time(
            bwd(lambda: (blk.mlp(rms_norm(x, blk.mlp_norm)) * ct).sum()), reps),
        "lm_head_matmul_fwd_bwd": _time(bwd(lambda: ((x @ model.lm_head) * lg_ct).sum()), reps),
        "cross_entropy_fwd_bwd": _time(bwd(lambda: nll(logits)), reps),
        "cross_entropy_fwd": _time(lambda: nll(logits.detach()), reps),
    }


# ============================================================================ main

def model_from_args(args) -> ModelConfig:
    m = from_preset(args.preset).model
    over = {k: v for k, v in (("n_layers", args.n_layers), ("d_ff", args.d_ff),
                              ("d_model", args.d_model), ("vocab_size", args.vocab),
                              ("n_heads", args.n_heads)) if v is not None}
    return dataclasses.replace(m, **over)


CONTESTANTS = ("jax", "torch_eager", "torch_compile")


def alone(args) -> dict:
    """Item 1's control: each contestant timed in a process of its own (in one process the three
    share two cores' thread pools), the processes alternating over --alone-rounds rounds; the
    ratios of the medians of every timed step."""
    import subprocess
    import tempfile

    names = [n for n in CONTESTANTS if not (args.no_compile and n == "torch_compile")]
    same = ["--preset", args.preset, "--seq-len", str(args.seq_len), "--batch", str(args.batch),
            "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--block",
            str(args.block), "--attn", args.attn, "--torch-adamw", args.torch_adamw,
            "--torch-device", args.torch_device]
    same += [a for k in ("n_layers", "d_ff", "d_model", "n_heads", "vocab")
             if getattr(args, k) is not None for a in (f"--{k.replace('_', '-')}",
                                                       str(getattr(args, k)))]
    steps = {n: [] for n in names}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.alone_rounds):
            for n in names:
                out = os.path.join(tmp, f"{n}-{r}.json")
                subprocess.run([sys.executable, __file__, *same, "--only", n, "--out", out],
                               check=True, stdout=subprocess.DEVNULL)
                with open(out) as f:
                    res = json.load(f)["results"][n]
                steps[n] += res["step_s_all"]
                runs.append({"round": r, "contestant": n, "step_s_median": res["step_s_median"]})
                print(f"round {r + 1}/{args.alone_rounds}: {n} alone "
                      f"{1e3 * res['step_s_median']:.0f} ms", flush=True)
    med = {n: statistics.median(ts) for n, ts in steps.items()}
    ratios = {f"jax_over_{n}": med[n] / med["jax"] for n in names if n != "jax"}
    print(", ".join(f"{k}: {v:.3f}" for k, v in ratios.items()))
    out = {"benchmark": "bench_vs_torch --alone", "preset": args.preset, "seq_len": args.seq_len,
           "batch": args.batch, "rounds_per_process": args.rounds,
           "alone_rounds": args.alone_rounds, **environment(), "step_s_median": med,
           "step_s_all": steps, "runs": runs, **ratios}
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


def main(argv: list[str] | None = None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--preset", default="41M-L2", help="model shape from a preset (41M-L2: baseline)")
    p.add_argument("--n-layers", type=int)
    p.add_argument("--d-ff", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per contestant")
    p.add_argument("--rounds", type=int, default=4, help="alternation rounds")
    p.add_argument("--block", type=int, default=1, help="timed steps per contestant per round")
    p.add_argument("--quick", action="store_true", help="T=128, B=2, 1 warmup, 2 rounds")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "math"],
                   help="PyTorch attention: F.scaled_dot_product_attention or einsum+softmax")
    p.add_argument("--torch-adamw", default="fused", choices=["fused", "foreach", "default"],
                   help="torch.optim.AdamW implementation (fused: the fastest on CPU)")
    p.add_argument("--torch-device", default="auto", help="cpu, cuda or auto (cuda if jax is on GPU)")
    p.add_argument("--profile", action="store_true", help="also time the pieces of a step")
    p.add_argument("--alone", action="store_true",
                   help="each contestant in a process of its own, --alone-rounds alternating")
    p.add_argument("--alone-rounds", type=int, default=2)
    p.add_argument("--only", choices=CONTESTANTS, help="time this contestant alone (--alone's child)")
    p.add_argument("--profile-reps", type=int, default=3)
    p.add_argument("--out", default="bench_vs_torch.json")
    args = p.parse_args(argv)
    if torch is None:
        raise SystemExit("PyTorch is not installed: pip install torch (CPU wheel is enough)")
    if args.quick:
        args.seq_len, args.batch, args.warmup, args.rounds = 128, 2, 1, 2
    if args.alone:
        if args.profile or args.only:
            p.error("--alone times whole steps in child processes: not with --profile or --only")
        return alone(args)
    torch.set_num_threads(os.cpu_count())
    dev = args.torch_device
    if dev == "auto":
        dev = "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"

    m = model_from_args(args)
    cfg = bench_config(m, args.seq_len, args.batch)
    batch = random_lm_batch(cfg)
    tokens = args.batch * args.seq_len
    fpt = train_flops_per_token(m, args.seq_len)
    peak = measure_matmul_peak(jnp.float32)
    print(f"model L={m.n_layers} d_model={m.d_model} d_ff={m.d_ff} V={m.vocab_size} "
          f"({param_count(m) / 1e6:.2f}M params), T={args.seq_len}, B={args.batch}; "
          f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch {torch.__version__} "
          f"on {dev} with {torch.get_num_threads()} threads; fp32 matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s", flush=True)

    contestants, errors, first_loss, compile_s = {}, {}, {}, {}
    t0 = time.perf_counter()
    jx = JaxSide(cfg, batch)
    contestants["jax"] = jx.step
    setups = [("torch_eager", False)] + ([] if args.no_compile else [("torch_compile", True)])
    setups = [(n, c) for n, c in setups if args.only in (None, n)]
    for name, compiled in setups:
        contestants[name] = TorchSide(cfg, batch, jx.initial_model, compiled, args.attn, dev,
                                      args.torch_adamw).step
    if args.only:  # the jax side is built all the same: torch starts from its weights
        contestants = {args.only: contestants[args.only]}
    times = {k: [] for k in contestants}
    losses = {k: [] for k in contestants}

    for name in list(contestants):  # warmup: the first call of jax and torch.compile compiles
        try:
            first_loss[name], compile_s[name] = timed(contestants[name], block=False)
            for _ in range(args.warmup - 1):
                contestants[name]()
        except Exception as e:  # noqa: BLE001  (torch.compile may fail on a bare machine)
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:500] if str(e) else ''}"
            print(f"{name} failed, dropped: {errors[name]}", flush=True)
            del contestants[name], times[name], losses[name]
        else:
            print(f"{name}: first step {compile_s[name]:.2f} s (loss {first_loss[name]:.5f})",
                  flush=True)
    for r in range(args.rounds):
        for name, fn in contestants.items():
            for _ in range(args.block):
                loss, seconds = timed(fn, block=False)  # fn returns a float: it has waited
                losses[name].append(loss)
                times[name].append(seconds)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} {1e3 * times[k][-1]:.0f} ms" for k in times), flush=True)

    results = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        results[name] = {"step_s_median": med, "step_s_mean": statistics.fmean(ts),
                         "step_s_min": min(ts), "step_s_all": ts, "tokens_per_s": tokens / med,
                         "mfu_vs_measured_fp32_peak": tokens / med * fpt / peak,
                         "first_step_s": compile_s[name], "first_loss": first_loss[name],
                         "last_loss": losses[name][-1]}
    ratio = (results["jax"]["tokens_per_s"] / results["torch_eager"]["tokens_per_s"]
             if {"jax", "torch_eager"} <= results.keys() else None)
    print(f"\n{'':16}{'step ms (median)':>17}{'tokens/s':>11}{'MFU %':>7}{'first step s':>13}"
          f"{'first loss':>12}")
    for name, r in results.items():
        print(f"{name:16}{1e3 * r['step_s_median']:>17.1f}{r['tokens_per_s']:>11,.0f}"
              f"{100 * r['mfu_vs_measured_fp32_peak']:>7.1f}{r['first_step_s']:>13.2f}"
              f"{r['first_loss']:>12.5f}")
    if ratio is not None:
        print(f"jax / torch_eager tokens/s: {ratio:.3f} (target >= 1.0)")
    if {"jax", "torch_compile"} <= results.keys():
        print(f"jax / torch_compile tokens/s: "
              f"{results['jax']['tokens_per_s'] / results['torch_compile']['tokens_per_s']:.3f}")

    out = {
        "benchmark": "bench_vs_torch",
        "model": dataclasses.asdict(m), "params": param_count(m), "seq_len": args.seq_len,
        "batch": args.batch, "tokens_per_step": tokens, "flops_per_token": fpt,
        "warmup": args.warmup, "rounds": args.rounds, "block": args.block,
        "torch_attention": args.attn, "torch_adamw": args.torch_adamw, "torch_device": dev,
        **environment(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                      xla_flags=os.environ.get("XLA_FLAGS", "")),
        "measured_fp32_matmul_flops": peak,
        "results": results, "errors": errors,
        "jax_over_torch_eager": ratio,
        "jax_over_torch_compile": (results["jax"]["tokens_per_s"]
                                   / results["torch_compile"]["tokens_per_s"]
                                   if {"jax", "torch_compile"} <= results.keys() else None),
        "first_loss_abs_diff_jax_torch_eager": (abs(first_loss["jax"] - first_loss["torch_eager"])
                                                if ratio is not None else None),
        "wall_s": time.perf_counter() - t0,
    }
    if args.profile:
        print("\nprofile (seconds, median of pieces each jitted / run alone):", flush=True)
        pj = profile_jax(cfg, batch, args.profile_reps)
        pt = (profile_torch(cfg, batch, args.attn, args.torch_adamw, args.profile_reps)
              if dev == "cpu" else {})
        pieces = ("attention_sublayer_fwd_bwd_x_layers", "mlp_sublayer_fwd_bwd_x_layers",
                  "lm_head_matmul_fwd_bwd", "cross_entropy_fwd_bwd")
        for prof in (pj, pt):  # what the pieces do not explain: embedding, bias grad, glue
            if prof:
                prof["forward_backward_minus_pieces"] = (prof["forward_backward"]
                                                         - sum(prof[k] for k in pieces))
        pj["full_train_step"] = results["jax"]["step_s_median"]
        if pt:
            pt["full_train_step"] = results["torch_eager"]["step_s_median"]
        print(f"{'piece':40}{'jax':>10}{'torch':>10}{'jax/torch':>10}")
        for k in pj:
            tv = pt.get(k, float("nan"))
            print(f"{k:40}{pj[k]:>10.4f}{tv:>10.4f}{pj[k] / tv:>10.2f}")
        out["profile"] = {"jax": pj, "torch_eager": pt}
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
