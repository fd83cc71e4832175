"""Run kinds as choices: one class per kind of run, in one module of this package each.

A kind of run is what train.py does with a config: pretrain a decoder LM, fine-tune it as a
prefix LM, pretrain an ACT/ALBERT/BERT encoder, probe one, pretrain a BERT encoder with MLM, or
fuse a backbone's layers for NER or MLM. A class holds everything the rest of the code asks of
its kind: its name (in messages), the settings only some kinds read (``READS``), which configs
it runs (``claims``: by task.name and the kinds model.arch's class names, archs.py; exactly one
kind claims any valid config), what it refuses among them (``check``, a ConfigError naming the
field), its Task's keyword options and its optimizer recipe (``RECIPE``). Nothing outside these
modules compares a kind's name. The Task that runs a kind imports it (``TaskBase.RUNS``):
config.py decides a config's kind while it validates and the task modules import config.py,
so the edge can only point that way. A new kind is a new module here (each is imported below)
and its Task under jaxdepth/tasks/. This package imports nothing of jaxdepth but errors.py,
choices.py and task_names.py, not even config.py for type checking: a ``cfg`` here is a
config.Config.
"""
from __future__ import annotations

from typing import ClassVar

from ...choices import Choices, Registered, import_all
from ...errors import ConfigError
from ..task_names import TASKS


KINDS: Choices[type["RunKind"]] = Choices("run kind", "run kind", order=lambda cls: cls.ORDER)

# Settings that several kinds read (``RunKind.READS``): the training corpus (data.corpus or the
# embedded grammar, and how validation is split off it), the grammar's own documents, and how
# MLM examples are made.
CORPUS = ("data.corpus", "data.valid", "data.valid_fraction", "data.valid_seed")
GRAMMAR = ("data.grammar_docs", "data.grammar_seed")
MLM_EXAMPLES = ("data.mask_rate", "data.max_predictions", "data.max_ngram")
FROM_PRETRAINED = ("task.init_from", "task.init_step")  # starts from a pretrained run


def moments(b1: float, b2: float, eps: float) -> dict[str, dict]:
    """A recipe's b1/b2/eps (optimizers.OWN_FIELDS), by optimizer: for its own optimizer and, as
    before optimizers were classes, for AdamW or LAMB named instead; an optimizer added since
    (Lion) takes its own DEFAULTS in every kind."""
    m = {"b1": b1, "b2": b2, "eps": eps}
    return {"adamw": m, "lamb": m}


class RunKind(Registered):
    NAME: ClassVar[str]  # in messages
    ORDER: ClassVar[int] = 100  # place in messages and --help (then by name)
    # READS: the settings ("section.field", or a whole "section") that this kind reads and
    # some other kind does not. Given on the command line for a kind that does not read it,
    # such a setting is refused (cli.refuse_unread); a setting no kind names is read by all.
    DEFAULT: ClassVar[bool] = False  # the kind of the default config (one kind says so)
    # The optimizer settings a config leaves unset take these (config.optim.RECIPE_FIELDS, with
    # "moments" per optimizer): the kind's paper's recipe (docs/design.md §6).
    RECIPE: ClassVar[dict]
    REGISTRY = KINDS

    @classmethod
    def defined(cls) -> None:
        missing = [] if hasattr(cls, "RECIPE") else ["RECIPE"]
        if cls.claims.__func__ is RunKind.claims.__func__:
            missing.append("claims")
        if missing:
            raise TypeError(f"run kind {cls.NAME!r} defines no {', '.join(missing)}")

    @classmethod
    def claims(cls, cfg) -> bool:
        """Whether cfg is a run of this kind (no other kind claims it)."""
        return False

    @classmethod
    def check(cls, cfg) -> None:
        """A ConfigError naming the field, for a config this kind claims but cannot run."""

    @classmethod
    def options(cls, cfg) -> dict:
        """Keyword options of the Task's constructor."""
        return {}

    @classmethod
    def recipe(cls, cfg) -> dict:
        """The optimizer recipe of this kind for cfg."""
        return cls.RECIPE


def kind_of(cfg) -> type[RunKind]:
    """The kind of run cfg describes, or a ConfigError (naming the field) for a config no kind
    runs. The one place that looks at model.arch and task.name together."""
    if cfg.task.pack and cfg.task.name not in TASKS:  # a preset may set it before task.name
        raise ConfigError(f"task.pack: packs the examples of prefix-LM fine-tuning (task.name "
                          f"one of {', '.join(TASKS)}); task.name={cfg.task.name!r} has none "
                          f"to pack", field="task.pack")
    claimed = [k for k in map(KINDS, KINDS.names()) if k.claims(cfg)]
    assert len(claimed) == 1, (f"run kinds {[k.NAME for k in claimed]} claim model.arch="
                               f"{cfg.model.arch!r}, task.name={cfg.task.name!r}")
    claimed[0].check(cfg)
    return claimed[0]


def default_recipe() -> dict:
    """The recipe of an OptimConfig outside a Config: the default run's (``DEFAULT``)."""
    return next(k for k in map(KINDS, KINDS.names()) if k.__dict__.get("DEFAULT")).RECIPE


import_all(__name__, __path__)
