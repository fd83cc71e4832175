"""The run kinds: the one dispatch on model.arch / task.name, and what every kind provides."""
import itertools

import pytest

from jaxdepth.config import (ARCHS, FUSION_TASKS, PROBE_TASKS, TASKS, Config, ConfigError,
                             apply_overrides)
from jaxdepth.models.archs import arch as arch_class
from jaxdepth.config.run_kinds import KINDS, kind_of
from jaxdepth.tasks.task_base import TaskBase, runner


def _task_classes():
    return [(k, runner(KINDS(k))) for k in KINDS.names()]


def _cfg(arch="decoder", name="", **task):
    return apply_overrides(Config(), {"model": {"arch": arch}, "task": {"name": name, **task}})


@pytest.mark.parametrize("arch, name, kind", [
    ("decoder", "", "lm"), ("decoder", "passivization", "prefix_lm"),
    ("act", "", "encoder_pretrain"), ("albert", "roles", "probe"), ("encoder", "", "encoder_mlm"),
    ("encoder", "mlm", "mlm"), ("act", "mlm", "mlm")])
def test_kind_of(arch, name, kind):
    assert kind_of(_cfg(arch, name)).NAME == kind


def _options(arch, name=""):
    cfg = _cfg(arch, name)
    return kind_of(cfg).options(cfg)


def test_encoder_options_follow_the_architecture():
    assert _options("albert") == {"arch": "albert", "untied": False, "adaptive": False,
                                  "halting": "fixed"}
    assert _options("bert", "roles") == {"arch": "bert", "untied": True, "adaptive": False,
                                         "halting": "act", "token_level": True}
    assert _options("act", "tense")["token_level"] is False


@pytest.mark.parametrize("arch, name", [("act", "cogs"), ("decoder", "roles"), ("encoder", "roles")])
def test_impossible_combinations_are_refused(arch, name):
    with pytest.raises(ConfigError, match="task.name"):
        kind_of(_cfg(arch, name, dir="x"))


@pytest.mark.parametrize("arch, name", [("decoder", ""), ("act", "roles"), ("encoder", "ner")])
def test_packing_outside_prefix_lm_fine_tuning_is_refused(arch, name):
    assert kind_of(_cfg("decoder", "cogs", dir="x", pack=True)).NAME == "prefix_lm"
    with pytest.raises(ConfigError, match="task.pack"):
        kind_of(_cfg(arch, name, dir="x", pack=True))


def test_every_registered_kind_evaluates_its_checkpoints():
    """eval.py calls the CheckpointEval protocol (eval_request.py) and the trainer the Task
    protocol (trainer/task.py): every registered class defines each method of both itself or
    through a base of its own kind."""
    assert set(KINDS.names()) == {"lm", "prefix_lm", "encoder_pretrain", "probe", "encoder_mlm",
                                 "mlm", "ner"}
    import dataclasses

    from jaxdepth.tasks.eval_request import CheckpointEval, EvalRequest
    from jaxdepth.trainer.task import Task
    methods = [n for p in (Task, CheckpointEval) for n, v in vars(p).items()
               if callable(v) and not n.startswith("_")]
    assert {"evaluate_checkpoint", "build_model", "evaluate"} <= set(methods)
    # everything the trainer asks a task, a run of several trials' questions included (the
    # model's and eval.py's are asked elsewhere: models/declared.py, eval_request.py)
    assert {n for n, v in vars(Task).items() if callable(v) and not n.startswith("_")} == {
        "build_model", "prepare", "dataset", "initial_model", "model_ready", "objective",
        "evaluate", "evaluates_alike", "share_shapes", "share_start", "trial_shared",
        "write_outputs_to", "summary"}
    requests = {f.name for f in dataclasses.fields(EvalRequest)}
    for kind, cls in _task_classes():
        for method in methods:  # the protocol is every method train.py, eval.py and the trainer call
            assert callable(getattr(cls, method, None)), (kind, method)
        assert cls.EVAL_READS <= requests, (kind, cls.EVAL_READS - requests)


def test_each_kind_declares_the_eval_request_fields_it_reads():
    """EVAL_READS is what eval.py lets through: it must be what each kind's
    evaluate_checkpoint reads from its request (read here from its source), no more, no less."""
    import inspect
    import re

    for kind, cls in _task_classes():
        source = inspect.getsource(cls.evaluate_checkpoint)
        read = set(re.findall(r"request\.(\w+)", source))
        if "scored_on(cfg, request)" in source:  # tasks/eval_request.py:scored_on
            read |= {"data", "batch"}
        assert read == set(cls.EVAL_READS), (kind, read, cls.EVAL_READS)


def test_exactly_one_kind_claims_each_architecture_and_task():
    """Every model.arch with every task.name is claimed by one kind (checked or refused by it
    alone), so the kinds' order never decides a run."""
    for arch, name in itertools.product(ARCHS, ("",) + TASKS + PROBE_TASKS + FUSION_TASKS):
        cfg = _cfg(arch, name, dir="x")
        claimed = [k for k in KINDS.names() if KINDS(k).claims(cfg)]
        assert len(claimed) == 1, (arch, name, claimed)


def test_each_kind_is_run_by_one_task_class_that_names_it():
    for kind, cls in _task_classes():
        assert isinstance(cls, type) and issubclass(cls, TaskBase), kind
        assert cls.__dict__["RUNS"] is KINDS(kind), kind


def test_a_second_task_for_a_kind_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match="Task of run kind 'lm' is defined twice"):
        type("AnotherLM", (TaskBase,), {"RUNS": KINDS("lm")})


def test_the_settings_that_choices_declare_exist():
    """Every choice's READS (run kinds, architectures, optimizers, schedules, fusion methods)
    names settings as "section.field" (or, for run kinds, "section"): a misspelt one would
    refuse nothing."""
    import dataclasses

    from jaxdepth.choices import Choices
    from jaxdepth.config import SECTIONS
    known = {f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    declaring = set()
    for field, registry in Choices.registries():
        for name in registry.names():
            reads = set(registry(name).READS)
            sections = set(SECTIONS) if field == "run kind" else set()
            assert reads <= known | sections, (field, name, reads - known - sections)
            declaring |= {field} if reads else set()
    assert declaring == {"run kind", "model.arch", "optim.name", "optim.schedule",
                         "fusion.method"}, declaring
    for name in ARCHS:  # the architectures', in the section they describe
        reads = set(arch_class(name).READS)
        assert all(r.startswith(arch_class(name).SECTION + ".") for r in reads), name


def test_the_kinds_that_architectures_name_exist():
    """archs.py names the run kinds that train and fine-tune each architecture by their NAME:
    a misspelt one would claim nothing."""
    from jaxdepth.models.archs import arch
    for name in ARCHS:
        a = arch(name)
        assert a.PRETRAINING in KINDS.names() and a.FINETUNING in (None, *KINDS.names()), name


def test_a_kind_that_misses_a_declaration_is_refused_when_defined():
    from jaxdepth.config.run_kinds import RunKind

    with pytest.raises(TypeError, match="run kind 'half' defines no RECIPE, claims"):
        class Half(RunKind):  # noqa: F841
            NAME = "half"
    assert "half" not in KINDS.names()
