"""Each run kind's optimizer recipe (RunKind.RECIPE, jaxdepth/config/run_kinds/): applied only to the
fields a config leaves unset, printed at start-up, saved resolved, and independent of every
other kind's recipe."""
import dataclasses
import json

import pytest

from jaxdepth import config as C
from jaxdepth.config.cli import parse_args, preset_lines
from jaxdepth.config import Config, ConfigError, OptimConfig, TaskConfig, apply_overrides
from jaxdepth.config.run_kinds import KINDS
from jaxdepth.config.trials import trial_configs

NER = ["--task.name", "ner", "--task.dir", "wikiann"]

# (command line, kind, the optimizer it must resolve to: name, lr, schedule, warmup,
# min_lr_ratio, weight decay, b2, clip) -- the papers' recipes, written out independently of
# the kinds' RECIPEs. Adafactor reads no b2: None.
CASES = [
    ([], "lm", ("adafactor", 6e-2, "cosine", 50, 0.1, 0.0, None, 1.0)),
    (["--task.name", "semantic_parsing"], "prefix_lm",
     ("adafactor", 1e-3, "constant", 0, 0.1, 0.0, None, 0.0)),
    (["--model.arch", "act"], "encoder_pretrain",
     ("lamb", 1.76e-3, "linear", 100, 0.0, 0.01, 0.999, 1.0)),
    (["--model.arch", "bert", "--task.name", "roles"], "probe",
     ("lamb", 1.76e-3, "linear", 100, 0.0, 0.01, 0.999, 1.0)),
    (["--model.arch", "encoder"], "encoder_mlm",
     ("adamw", 1e-4, "linear", 100, 0.0, 0.01, 0.999, 1.0)),
    (NER + ["--fusion.mode", "ft"], "ner", ("adamw", 5e-5, "linear", 0, 0.0, 0.01, 0.999, 1.0)),
    (NER, "ner", ("adamw", 1e-3, "linear", 0, 0.0, 0.01, 0.999, 1.0)),  # fe: a fresh head
    (["--task.name", "mlm", "--fusion.mode", "ft"], "mlm",
     ("adamw", 5e-5, "linear", 0, 0.0, 0.01, 0.999, 1.0)),
]


def _optim(cfg):
    o = cfg.optim
    return (o.name, o.lr, o.schedule, o.warmup_steps, o.min_lr_ratio, o.weight_decay, o.b2,
            o.clip_norm)


@pytest.mark.parametrize("argv,kind,expected", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_each_kind_resolves_its_own_recipe(argv, kind, expected):
    cfg = parse_args(argv)
    assert C.kind_of(cfg).NAME == kind
    assert _optim(cfg) == expected
    # saved resolved: a resumed run keeps it whatever the recipes become
    saved = cfg.to_dict()["optim"]
    assert (saved["name"], saved["lr"], saved["schedule"]) == expected[:3]
    # every field the optimizer reads is saved (those it does not read are null, from no recipe)
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))).optim.from_recipe == frozenset()


def test_a_value_given_is_kept_and_the_rest_comes_from_the_recipe():
    cfg = parse_args(NER + ["--optim.lr", "3e-4", "--optim.weight_decay", "0"])
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (3e-4, 0.0)
    assert (cfg.optim.name, cfg.optim.schedule, cfg.optim.b2) == ("adamw", "linear", 0.999)
    assert "lr" not in cfg.optim.from_recipe and "weight_decay" not in cfg.optim.from_recipe
    # a preset's optimizer values are the user's too
    act = parse_args(["--preset", "act-tiny"])
    assert act.optim.warmup_steps == 100 and "warmup_steps" not in act.optim.from_recipe
    # the preset leaves LAMB's moments to the kind's recipe, so naming another optimizer over
    # it does not inherit them
    assert act.optim.from_recipe == {"b1", "b2", "eps"}
    assert (act.optim.b1, act.optim.b2, act.optim.eps) == (0.9, 0.999, 1e-6)
    ada = parse_args(["--preset", "act-tiny", "--optim.name", "adafactor", "--optim.lr", "1e-2"])
    assert (ada.optim.name, ada.optim.b1, ada.optim.eps) == ("adafactor", None, None)


def test_changing_one_kinds_recipe_leaves_the_others(monkeypatch):
    before = {kind: _optim(parse_args(argv)) for argv, kind, _ in CASES}
    lm = KINDS("lm")
    monkeypatch.setattr(lm, "RECIPE", {**lm.RECIPE, "name": "adamw", "lr": 0.5})
    after = {kind: _optim(parse_args(argv)) for argv, kind, _ in CASES}
    assert after["lm"][:2] == ("adamw", 0.5)
    assert {k: v for k, v in after.items() if k != "lm"} == \
        {k: v for k, v in before.items() if k != "lm"}


def test_the_recipe_follows_the_kind_when_the_config_changes():
    lm = Config()
    ner = dataclasses.replace(lm, task=TaskConfig(name="ner", dir="x"))
    assert (ner.optim.name, ner.optim.lr) == ("adamw", 1e-3)
    via_overrides = apply_overrides(lm, {"task": {"name": "ner", "dir": "x"}})
    assert _optim(via_overrides) == _optim(ner)
    # a standalone OptimConfig is the LM pretraining recipe
    assert (OptimConfig().name, OptimConfig().lr) == ("adafactor", 6e-2)


def test_another_optimizer_without_a_learning_rate_is_refused():
    with pytest.raises(ConfigError, match=r"optim\.lr: the lm recipe's learning rate 0\.06 is "
                                          r"for adafactor; with optim\.name adamw give --optim\.lr"):
        parse_args(["--optim.name", "adamw"])
    # the lm recipe's moments (the values before recipes existed) apply to an optimizer that
    # reads them
    assert parse_args(["--optim.name", "adamw", "--optim.lr", "1e-3"]).optim.b2 == 0.99


def test_a_learning_rate_given_per_trial_satisfies_another_optimizer(tmp_path):
    """Every trial of --trials.lr has its own learning rate, so naming another optimizer than
    the recipe's needs no --optim.lr: each trial trains that optimizer at its own rate."""
    from jaxdepth.trainer.state import hparams
    cfg = parse_args(["--optim.name", "adamw", "--trials.lr", "1e-3,2e-3"])
    trials = trial_configs(cfg)
    assert [(c.optim.name, c.optim.lr, c.optim.b2) for c in trials] == \
        [("adamw", 1e-3, 0.99), ("adamw", 2e-3, 0.99)]
    assert hparams(trials)["lr"].tolist() == pytest.approx([1e-3, 2e-3])  # what the step reads
    # start-up does not claim the recipe's rate, which no trial runs at
    assert "lr=" not in " ".join(preset_lines(cfg))
    # a one-trial list, another kind, and a config file alike
    one = trial_configs(parse_args(NER + ["--optim.name", "adafactor", "--trials.lr", "1e-2"]))
    assert [(c.optim.name, c.optim.lr) for c in one] == [("adafactor", 1e-2)]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"optim": {"name": "lion"}, "trials": {"lr": "1e-4,3e-4"}}))
    assert [c.optim.lr for c in trial_configs(parse_args(["--config", str(path)]))] == \
        [1e-4, 3e-4]
    # a list that varies another field leaves the learning rate to be given
    with pytest.raises(ConfigError, match=r"^optim\.lr: the lm recipe's learning rate 0\.06"):
        parse_args(["--optim.name", "adamw", "--trials.weight_decay", "0,0.1"])


def test_a_moment_the_optimizer_does_not_read_is_refused_naming_both():
    with pytest.raises(ConfigError, match=r"^optim\.b1: the lm recipe's optimizer adafactor does "
                                          r"not read it \(read by: adamw, lamb.*--optim\.name$"):
        parse_args(["--optim.b1", "0.95"])  # the lm recipe's Adafactor
    with pytest.raises(ConfigError, match=r"^optim\.eps: optim\.name adafactor does not"):
        parse_args(NER + ["--optim.name", "adafactor", "--optim.lr", "1e-2", "--optim.eps", "1e-6"])
    # left to the kind's recipe, the optimizer is the kind's (ner: AdamW), which reads b1
    assert parse_args(NER + ["--optim.b1", "0.95"]).optim.b1 == 0.95
    # an optimizer the recipe does not name reads the recipe's moments where the recipe sets
    # them (the lm recipe's are the values from before recipes), and none it does not read
    lm_lamb = parse_args(["--optim.name", "lamb", "--optim.lr", "1e-3"]).optim
    assert (lm_lamb.b1, lm_lamb.b2, lm_lamb.eps) == (0.9, 0.99, 1e-8)  # the lm recipe's
    ner_ada = parse_args(NER + ["--optim.name", "adafactor", "--optim.lr", "1e-2"]).optim
    assert (ner_ada.b1, ner_ada.b2, ner_ada.eps) == (None, None, None)


def test_json_null_leaves_a_field_to_the_recipe(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"task": {"name": "ner", "dir": "x"}, "optim": {"lr": None}}))
    assert parse_args(["--config", str(path)]).optim.lr == 1e-3


def test_start_up_names_what_came_from_the_recipe():
    lines = preset_lines(parse_args(NER + ["--optim.lr", "3e-4"]))
    assert lines == ["recipe of run kind ner: optim: name=adamw, schedule=linear, warmup_steps=0, "
                     "min_lr_ratio=0.0, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-08, "
                     "clip_norm=1.0"]
    lines = preset_lines(parse_args(["--preset", "act-tiny"]))
    assert lines[-2].startswith("preset act-tiny: optim: name=lamb")
    assert lines[-1] == "recipe of run kind encoder_pretrain: optim: b1=0.9, b2=0.999, eps=1e-06"


def test_experiments_pin_their_whole_recipe():
    """The experiments' recipes are what their documented tables were measured with, whatever the
    kinds' recipes become."""
    from jaxdepth.experiments import fusion_fewshot as ff
    from jaxdepth.experiments.depth_sweep import MINIATURE, PAPER_FINETUNE
    fields = {f"optim.{f}" for f in C.RECIPE_FIELDS}
    assert fields <= set(ff.PRESETS["miniature"]["finetune"])
    assert fields <= set(ff.PRESETS["miniature"]["pretrain"])
    assert fields - {"optim.b1", "optim.b2", "optim.eps"} <= set({**PAPER_FINETUNE, **MINIATURE.finetune})


def test_the_design_s_recipe_table_is_the_kinds_recipes():
    """docs/design.md §6 describes each kind's recipe in words: its optimizer, learning rate,
    schedule and clipping are those of RunKind.RECIPE, where the recipe is written."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*)(?: \(fusion\))? \| (.*?) \|", line)
        if m:
            for kind in re.findall(r"`([a-z_]+)`", m.group(1)):
                rows[kind] = m.group(2)
    assert set(rows) == set(KINDS.names())
    for kind, row in rows.items():
        recipe = KINDS(kind).RECIPE
        opt, lr = re.match(r"(\w+) ([0-9.e-]+)", row).groups()
        assert opt.lower() == recipe["name"] and float(lr) == recipe["lr"], (kind, row)
        assert recipe["schedule"] in row, (kind, row)
        assert ("no clipping" in row) == (recipe["clip_norm"] == 0.0), (kind, row)
