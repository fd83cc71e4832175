"""The Task (trainer/task.py) that runs each kind of run (jaxdepth/config/run_kinds/ declares the
kinds; each Task class names the kind it runs, ``TaskBase.RUNS``); ``task_for(config)``
(registry.py) builds it, ``train(config)`` trains with it. Every module of this package is
imported here, so that each kind finds its Task.

    lm                causal LM pretraining of the decoder           (lm.py)
    prefix_lm         prefix-LM fine-tuning on a seq2seq task        (prefix_lm.py)
    encoder_pretrain  ACT / ALBERT / BERT MLM + SOP pretraining      (encoder_pretrain.py)
    probe             encoder fine-tuning on the probing tasks       (probe.py)
    encoder_mlm       MLM pretraining of the BERT encoder            (mlm.py)
    mlm, ner          layer fusion over a backbone: MLM, NER         (mlm.py, ner.py)
"""
from __future__ import annotations

from ..choices import import_all
from ..config.run_kinds import kind_of
from .registry import load_model, task_for, train

__all__ = ["kind_of", "load_model", "task_for", "train"]
import_all(__name__, __path__)
