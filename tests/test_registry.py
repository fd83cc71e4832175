"""The task registry: the one dispatch on model.arch / task.name, and what every kind provides."""
import pytest

from jaxdepth.config import Config, ConfigError, apply_overrides
from jaxdepth.tasks import kind_of, registry


def _cfg(arch="decoder", name="", **task):
    return apply_overrides(Config(), {"model": {"arch": arch}, "task": {"name": name, **task}})


@pytest.mark.parametrize("arch, name, kind", [
    ("decoder", "", "lm"), ("decoder", "passivization", "prefix_lm"),
    ("act", "", "encoder_pretrain"), ("albert", "roles", "probe"), ("encoder", "", "encoder_mlm"),
    ("encoder", "mlm", "mlm"), ("act", "mlm", "mlm")])
def test_kind_of(arch, name, kind):
    assert kind_of(_cfg(arch, name))[0] == kind


def test_encoder_options_follow_the_architecture():
    assert kind_of(_cfg("albert"))[1] == {"arch": "albert", "untied": False, "adaptive": False,
                                          "halting": "fixed"}
    assert kind_of(_cfg("bert", "roles"))[1] == {"arch": "bert", "untied": True, "adaptive": False,
                                                 "halting": "act", "token_level": True}
    assert kind_of(_cfg("act", "tense"))[1]["token_level"] is False


@pytest.mark.parametrize("arch, name", [("act", "cogs"), ("decoder", "roles"), ("encoder", "roles")])
def test_impossible_combinations_are_refused(arch, name):
    with pytest.raises(ConfigError, match="task.name"):
        kind_of(_cfg(arch, name, dir="x"))


@pytest.mark.parametrize("arch, name", [("decoder", ""), ("act", "roles"), ("encoder", "ner")])
def test_packing_outside_prefix_lm_fine_tuning_is_refused(arch, name):
    assert kind_of(_cfg("decoder", "cogs", dir="x", pack=True))[0] == "prefix_lm"
    with pytest.raises(ConfigError, match="task.pack"):
        kind_of(_cfg(arch, name, dir="x", pack=True))


def test_every_registered_kind_reports_and_evaluates_its_checkpoints():
    """train.py prints task.report(summary) and eval.py calls task.evaluate_checkpoint: every
    registered class defines both itself or through a base of its own kind."""
    assert set(registry._KINDS) == {"lm", "prefix_lm", "encoder_pretrain", "probe", "encoder_mlm",
                                    "mlm", "ner"}
    import dataclasses

    from jaxdepth.trainer.task import EvalRequest, Task
    methods = [n for n, v in vars(Task).items() if callable(v) and not n.startswith("_")]
    assert {"report", "evaluate_checkpoint", "build_model", "evaluate"} <= set(methods)
    requests = {f.name for f in dataclasses.fields(EvalRequest)}
    for kind, cls in registry._KINDS.items():
        for method in methods:  # the protocol is every method train.py, eval.py and the trainer call
            assert callable(getattr(cls, method, None)), (kind, method)
        assert cls.EVAL_READS <= requests, (kind, cls.EVAL_READS - requests)


def test_each_kind_declares_the_eval_request_fields_it_reads():
    """EVAL_READS is what eval.py lets through: it must be what each kind's
    evaluate_checkpoint reads from its request (read here from its source), no more, no less."""
    import inspect
    import re

    for kind, cls in registry._KINDS.items():
        source = inspect.getsource(cls.evaluate_checkpoint)
        read = set(re.findall(r"request\.(\w+)", source))
        if "scored_on(cfg, request)" in source:  # tasks/open_run.py:scored_on
            read |= {"data", "batch"}
        assert read == set(cls.EVAL_READS), (kind, read, cls.EVAL_READS)
