"""One module per kind of run, each a Task (trainer/task.py); ``task_for(config)`` (registry.py)
is the one place that decides which.

    lm                causal LM pretraining of the decoder           (lm.py)
    prefix_lm         prefix-LM fine-tuning on a seq2seq task        (prefix_lm.py)
    encoder_pretrain  ACT / ALBERT / BERT MLM + SOP pretraining      (encoder_pretrain.py)
    probe             encoder fine-tuning on the probing tasks       (probe.py)
    encoder_mlm       MLM pretraining of the BERT encoder            (mlm.py)
    mlm, ner          layer fusion over a backbone: MLM, NER         (mlm.py, ner.py)
"""
from __future__ import annotations

from ..config import Config, trial_configs
from . import encoder_pretrain, lm, mlm, ner, prefix_lm, probe  # noqa: F401  (they register)
from .registry import kind_of, load_model, task_for

__all__ = ["kind_of", "load_model", "task_for", "train"]


def train(cfg: Config) -> dict:
    """Run (or resume) the training cfg describes, with one task per trial if it has trials;
    returns its summary."""
    from ..trainer.loop import train as run
    tasks = [task_for(c) for c in trial_configs(cfg)]
    return run(cfg, tasks if len(tasks) > 1 else tasks[0])
