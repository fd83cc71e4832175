"""Causal LM pretraining of the T5 decoder (the default run): model.arch decoder, no task.name."""
from . import CORPUS, GRAMMAR, RunKind, moments


class LMPretraining(RunKind):
    NAME, ORDER = "lm", 0
    DEFAULT = True  # the default run's kind: a standalone OptimConfig takes its recipe
    READS = ("model.z_loss", "model.xent_chunk", *CORPUS, *GRAMMAR, "data.streaming",
             "data.streams", "data.workers", "data.restart_stream", "data.tokenizer_sample",
             "run.samples", "run.sample_tokens", "run.grammar_samples")
    # Adafactor's parameter-relative updates suit the t5x initialisation (N(0, 1) embeddings
    # next to 1/sqrt(fan-in) kernels); it learns the grammar's syntax where AdamW at 1e-2 does
    # not (docs/training.md).
    RECIPE = dict(name="adafactor", lr=6e-2, schedule="cosine", warmup_steps=50, min_lr_ratio=0.1,
                  weight_decay=0.0, clip_norm=1.0, moments=moments(0.9, 0.99, 1e-8))

    @classmethod
    def claims(cls, cfg) -> bool:
        return cfg.arch.PRETRAINING == cls.NAME and not cfg.task.name
