"""The model architectures (``model.arch``), one class each: which config section describes
the model, which kind of run trains it from scratch and which fine-tunes it on a task
(run_kinds.kind_of: the architecture decides the kind), the setting a trial varies as its
dropout rate, and, for the ALBERT family, the options of its encoder.

Nothing outside this module compares an architecture's name (the run kinds compare the kinds
an architecture names with their own). It imports nothing of jaxdepth but choices.py and the
act section's halting values (act_config.py), so that the configuration and run_kinds/ can ask
it without the models' code.
"""
from __future__ import annotations

from typing import ClassVar

from ..choices import Choices, Registered
from .act_config import FIXED


_ARCHS: Choices[type["Arch"]] = Choices("architecture", "model.arch",
                                        order=lambda cls: cls.ORDER)


class Arch(Registered):
    NAME: ClassVar[str]  # the value of model.arch
    ORDER: ClassVar[int]  # place in messages and --help
    # The one config section that describes the model: its shape, vocabulary and run-time
    # options ("model" or "act"); the other section must keep its defaults (config.Config).
    SECTION: ClassVar[str]
    PRETRAINING: ClassVar[str]  # the run kind of a config with no task.name
    FINETUNING: ClassVar[str | None] = None  # the run kind of a task that is not fusion's
    # The setting (trial_tracing.setting) a trial varies as the model's dropout rate; None: its rate
    # is not a trial setting (a BERT encoder's comes from its checkpoint as often as not).
    TRIAL_DROPOUT: ClassVar[str | None] = None

    REGISTRY = _ARCHS


class Decoder(Arch):
    """The T5.1.1 decoder-only LM (models/decoder.py)."""
    NAME, ORDER, SECTION = "decoder", 0, "model"
    PRETRAINING, FINETUNING, TRIAL_DROPOUT = "lm", "prefix_lm", "model.dropout"
    READS = ("model.rel_buckets", "model.rel_max_distance", "model.compute_dtype",
             "model.scan_unroll", "model.attention", "model.d_ff_multiple")


class Encoder(Arch):
    """The BERT/RoBERTa encoder (models/encoder.py): MLM pretraining, a fusion backbone."""
    NAME, ORDER, SECTION = "encoder", 1, "model"
    PRETRAINING = "encoder_mlm"


class ALBERTFamily(Arch):
    """The encoders of models/act.py, described by the act section: MLM + SOP pretraining,
    fine-tuned on the grammar's probing tasks."""
    SECTION, PRETRAINING, FINETUNING, TRIAL_DROPOUT = "act", "encoder_pretrain", "probe", \
        "act.dropout"
    UNTIED: ClassVar[bool] = False  # M separate layers (UntiedEncoder), not one shared layer
    ADAPTIVE: ClassVar[bool] = False  # its tokens halt on their own (evaluated with a while loop)

    @classmethod
    def halting(cls, cfg) -> str:
        """The act.halting its encoder runs with."""
        return cfg.act.halting


class ACT(ALBERTFamily):
    """One shared layer, each token halting on its own (Simoulin & Crabbé)."""
    NAME, ORDER, ADAPTIVE = "act", 2, True


class ALBERT(ALBERTFamily):
    """The shared layer applied exactly M times."""
    NAME, ORDER = "albert", 3

    @classmethod
    def halting(cls, cfg):
        return FIXED


class UntiedBERT(ALBERTFamily):
    """M separate layers with ALBERT's embeddings and heads."""
    NAME, ORDER, UNTIED = "bert", 4, True


# arch(name): the architecture called ``name`` (a ConfigError naming model.arch for any other)
arch, arch_names = _ARCHS, _ARCHS.names
