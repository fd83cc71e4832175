"""The named presets (``--preset NAME``, ``a+b`` applies a then b): every member of every size
class of Eq. 1 (``<class>-L<n>``, the paper's classes with its pretraining recipe), t5x
fine-tuning (``finetune``), COGS at CPU scale, and the ACT/ALBERT/BERT encoders."""
from __future__ import annotations

import dataclasses

from ..models.act_config import ACT_PRESETS
from . import Config, ConfigError, apply_overrides
from ..models.depth_family import SIZE_CLASSES, depth_family
from .run_kinds.encoder_pretraining import EncoderPretraining
from .run_kinds.prefix_lm_finetuning import PrefixLMFinetuning


def _recipe(kind, *fields: str) -> dict:
    """These fields of a run kind's recipe (RunKind.RECIPE, where each is written once)."""
    return {f: kind.RECIPE[f] for f in fields}


_PAPER_TRAINING = {  # Petty et al. pretraining (t5x): Adafactor, 1/sqrt(max(step, 10k)), C4
    # streamed (32 streams split over 1, 2, 4 or 8 hosts; 4 loader workers each)
    "data": {"seq_len": 1024, "batch_size": 128, "streaming": True, "streams": 32, "workers": 4},
    "optim": {"name": "adafactor", "lr": 1.0, "schedule": "rsqrt", "warmup_steps": 10000,
              "weight_decay": 0.0, "clip_norm": 0.0},
    # 20 validation batches (2.6M tokens): the whole C4 validation set would be packed into
    # memory at start-up
    "run": {"steps": 1_000_000, "eval_every": 5000, "eval_batches": 20, "save_every": 10000,
            "keep": 100},
}


# t5x fine-tuning defaults used by Petty et al. (docs/design.md §2). Combine with a model
# preset: --preset 134M-L4+finetune. Only the fields fine-tuning changes are set.
PAPER_FINETUNING = {
    "model": {"dropout": 0.1},
    "data": {"batch_size": 128},
    # the prefix_lm kind's recipe (t5x fine-tuning), pinned over a pretraining preset's
    "optim": _recipe(PrefixLMFinetuning, "name", "lr", "schedule", "warmup_steps",
                     "weight_decay", "clip_norm"),
    "run": {"steps": 10_000, "eval_every": 250, "save_every": 1000},
}


# Simoulin & Crabbe's pretraining recipe (ALBERT's), the encoder_pretrain kind's: LAMB, warmup
# then linear decay to 0, weight decay 0.01 off norms and biases, clipping 1.0. The CPU-scale
# presets warm up for 100 steps instead of 3125.
# Its moments (b1 0.9, b2 0.999, eps 1e-6) are left to the recipe, so that naming another
# optimizer over a preset does not inherit LAMB's.
ACT_PRETRAINING = _recipe(EncoderPretraining, "name", "lr", "schedule", "min_lr_ratio",
                          "weight_decay", "clip_norm")


def cogs_cpu() -> dict[str, dict]:
    """COGS at CPU scale (docs/depth.md, "COGS on two CPU cores"): the small class's 4-layer member
    trained from scratch within an hour on 2 cores. Measured choices: 4 heads (one or two
    wide heads learn to copy slowly), a BPE tokenizer (sequences 1.7x shorter than unigram's
    at this vocabulary), packed rows (several examples per step at no padding cost), and
    Adafactor with a cosine decay and no dropout. Name the task: --task.name cogs --task.dir."""
    model = dataclasses.asdict(depth_family("small")[4])
    return {
        "model": {**model, "n_heads": 4, "vocab_size": 768, "dropout": 0.0},
        "data": {"tokenizer_type": "bpe", "seq_len": 256, "batch_size": 32},
        "task": {"pack": True, "eval_max": 500},
        "optim": {"name": "adafactor", "lr": 0.05, "schedule": "cosine", "warmup_steps": 100,
                  "weight_decay": 0.0, "clip_norm": 1.0},
        "run": {"steps": 1800, "eval_every": 300, "save_every": 300, "samples": 0},
    }


def presets() -> dict[str, dict]:
    """name -> nested override dict. ``<class>-L<n>`` for every member of every size class."""
    out = {}
    for cname, c in SIZE_CLASSES.items():
        paper = cname not in ("tiny", "small")
        for n, m in depth_family(cname).items():
            over: dict[str, dict] = {"model": dataclasses.asdict(m)}
            if paper:
                for sec, vals in _PAPER_TRAINING.items():
                    over[sec] = dict(vals)
            out[f"{cname}-L{n}"] = over
    out["finetune"] = PAPER_FINETUNING
    out["cogs-cpu"] = cogs_cpu()
    for size, act in ACT_PRESETS.items():
        for arch in ("act", "albert", "bert"):
            out[f"{arch}-{size}"] = {
                "model": {"arch": arch}, "act": dict(act),
                "optim": {**ACT_PRETRAINING, "warmup_steps": 3125 if size == "base" else 100}}
    # ACT with halting that differs by token at CPU scale (docs/act.md, "Halting that differs by
    # token"): act-tiny where every token starts at M iterations (b_h = -2, p ~ 0.12) and a
    # small ponder weight pulls them down unevenly; with b_h = 0 every token locks at N = 2.
    tiny = out["act-tiny"]
    out["act-cpu"] = {**tiny, "act": {**tiny["act"], "tau": 1e-4, "halting_bias_init": -2.0},
                      "run": {"steps": 1500}}
    return out


def from_preset(name: str) -> Config:
    """``a+b`` applies preset a, then b (e.g. ``134M-L4+finetune``)."""
    table = presets()
    cfg = Config(preset=name)
    for part in name.split("+"):
        if part not in table:
            raise ConfigError(f"preset: unknown preset {part!r}; known: "
                              f"{', '.join(sorted(table))}", field="preset")
        cfg = apply_overrides(cfg, table[part])
    return cfg
