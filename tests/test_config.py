"""Config: Eq. 1 depth families (Table 1 of Petty et al.), parameter counts, validation, CLI."""
import dataclasses
import json
import re
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

import equinox as eqx
import jax
import numpy as np
import pytest

from jaxdepth.config.cli import parse_args
from jaxdepth.config import (SECTIONS, Config, ConfigError, DataConfig, FusionConfig, ModelConfig,
                             OptimConfig, RunConfig, apply_overrides)
from jaxdepth.models.depth_family import SIZE_CLASSES, depth_family, depth_family_dff, param_count
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.config.presets import from_preset

# Table 1 of Petty et al., copied cell by cell: n_layers -> d_ff.
TABLE1 = {
    "41M": {1: 4779, 2: 2048, 3: 1138, 4: 682, 5: 409, 6: 227, 7: 97},
    "134M": {1: 35847, 2: 17411, 4: 8193, 6: 5121, 8: 3584, 12: 2048, 16: 1280, 21: 731,
             26: 393, 32: 128},
    "374M": {1: 99002, 2: 48818, 4: 23726, 6: 15362, 8: 11180, 12: 6998, 16: 4907, 24: 2816,
             32: 1770},
}
TOTALS_M = {"41M": "41.29", "134M": "134.30", "374M": "374.13"}
BASELINE_LAYERS = {"41M": 2, "134M": 12, "374M": 24}


def test_table1_has_26_cells():
    assert sum(len(v) for v in TABLE1.values()) == 26


@pytest.mark.parametrize("cls", sorted(TABLE1))
def test_depth_family_reproduces_table1(cls):
    fam = depth_family(cls)
    assert sorted(fam) == sorted(TABLE1[cls])
    got = {n: fam[n].d_ff for n in fam}
    assert got == TABLE1[cls]
    for m in fam.values():
        assert m.vocab_size == 32128


@pytest.mark.parametrize("cls", sorted(TABLE1))
def test_class_totals(cls):
    base = depth_family(cls)[BASELINE_LAYERS[cls]]
    total = Decimal(param_count(base)) / Decimal(10**6)
    assert str(total.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)) == TOTALS_M[cls]
    # Every member has the baseline's size up to the rounding of w(k): |error in d_ff| <= 1/2,
    # i.e. at most n_layers * beta / 2 parameters (beta = 3 d_model).
    d = SIZE_CLASSES[cls].d_model
    for n, m in depth_family(cls).items():
        assert abs(param_count(m) - param_count(base)) <= n * 3 * d / 2, n


def eq1_decimal(d_model, n0, d_ff0, n):
    """Eq. 1 written independently: decimal arithmetic, explicit half-even rounding."""
    with localcontext() as ctx:
        ctx.prec = 60
        beta = Decimal(3 * d_model)
        a = Decimal(4 * d_model * d_model + 2 * d_model)
        k = Decimal(n - n0)
        w = (Decimal(1) - Decimal(n0) / (Decimal(n0) + k)) * (Decimal(d_ff0) + a / beta)
        w = w.quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
        return d_ff0 - int(w)


@pytest.mark.parametrize("d_model,n0,d_ff0,depths", [
    (64, 2, 256, [1, 2, 3, 4, 6]),          # the "tiny" class
    (128, 4, 512, [1, 2, 3, 4, 6, 8]),      # the "small" class
    (256, 3, 1000, [1, 2, 3, 5, 7, 9]),
    (96, 5, 777, [1, 4, 5, 6, 10]),
    # d_model=64: A/beta = 86 exactly, so n0=1, k=1 gives w = (d_ff0 + 86)/2: exact .5 ties.
    (64, 1, 101, [2]),   # 187/2 = 93.5 -> 94 (even) -> 7
    (64, 1, 103, [2]),   # 189/2 = 94.5 -> 94 (even) -> 9
])
def test_eq1_independent_form(d_model, n0, d_ff0, depths):
    for n in depths:
        assert depth_family_dff(d_model, n0, d_ff0, n) == eq1_decimal(d_model, n0, d_ff0, n)
    assert depth_family_dff(d_model, n0, d_ff0, n0) == d_ff0


def test_eq1_half_even_hand_values():
    assert depth_family_dff(64, 1, 101, 2) == 7
    assert depth_family_dff(64, 1, 103, 2) == 9
    # tiny class by hand: A/beta = 86, w(k) = k/(2+k) * 342
    assert depth_family_dff(64, 2, 256, 1) == 256 + 342   # w(-1) = (1 - 2/1) * 342 = -342
    assert depth_family_dff(64, 2, 256, 3) == 256 - 114   # 342/3 = 114
    assert depth_family_dff(64, 2, 256, 4) == 256 - 171   # 342/2


def test_eq1_too_deep_is_an_error():
    # small class (d_model 128, 4 layers, d_ff 512) at 16 layers: w = 12/16 * 683.33.. = 512.5
    with pytest.raises(ConfigError, match=r"^model\.d_ff"):
        depth_family_dff(128, 4, 512, 16)
    with pytest.raises(ConfigError, match=r"^model\.d_ff"):
        depth_family_dff(512, 2, 2048, 8)  # 41M class one deeper than its deepest member
    with pytest.raises(ConfigError, match=r"^model\.n_layers"):
        depth_family_dff(128, 4, 512, 0)


def hand_param_count(V, D, L, F, H, buckets=32):
    per_layer = 3 * D * F + 4 * D * D + 2 * D  # wi_0, wi_1, wo; q, k, v, o; two norm scales
    return L * per_layer + 2 * D * V + D + buckets * H  # embed + head, final norm, rel. bias


@pytest.mark.parametrize("V,D,L,F,heads", [
    (50, 32, 1, 48, 1),
    (97, 64, 3, 40, 4),
    (64, 48, 2, 100, 3),
    (20, 32, 2, 7, 0),  # n_heads 0 -> max(1, 32 // 64) = 1
])
def test_param_count_matches_built_model(V, D, L, F, heads):
    m = ModelConfig(vocab_size=V, d_model=D, n_layers=L, d_ff=F, n_heads=heads)
    # eval_shape runs the real constructor abstractly (building for real costs seconds of
    # compilation per shape on CPU); one config is also built for real below.
    model = eqx.filter_eval_shape(DecoderLM, m, key=jax.random.key(0))
    leaves = [x for x in jax.tree.leaves(model) if isinstance(x, jax.ShapeDtypeStruct)]
    assert all(x.dtype == np.float32 for x in leaves)
    n_built = sum(int(np.prod(x.shape)) for x in leaves)
    H = heads or 1
    assert param_count(m) == n_built == hand_param_count(V, D, L, F, H)


def test_param_count_hand_number():
    # 41M baseline written out: 2 * (3*512*2048 + 4*512*512 + 2*512) + 2*512*32128 + 512 + 32*8
    assert param_count(depth_family("41M")[2]) == 41_290_496


@pytest.mark.parametrize("make,field", [
    (lambda: ModelConfig(d_model=48, n_heads=5), "model.n_heads"),
    (lambda: ModelConfig(d_model=96, n_heads=7), "model.n_heads"),
    (lambda: ModelConfig(vocab_size=0), "model.vocab_size"),
    (lambda: ModelConfig(d_model=-64), "model.d_model"),
    (lambda: ModelConfig(n_layers=0), "model.n_layers"),
    (lambda: ModelConfig(d_ff=0), "model.d_ff"),
    (lambda: ModelConfig(n_heads=-1), "model.n_heads"),
    (lambda: ModelConfig(dropout=1.0), "model.dropout"),
    (lambda: ModelConfig(compute_dtype="float16"), "model.compute_dtype"),
    (lambda: ModelConfig(remat="some"), "model.remat"),
    (lambda: DataConfig(seq_len=0), "data.seq_len"),
    (lambda: DataConfig(batch_size=-2), "data.batch_size"),
    (lambda: OptimConfig(lr=0.0), "optim.lr"),
    (lambda: OptimConfig(schedule="step"), "optim.schedule"),
    (lambda: OptimConfig(schedule="rsqrt", warmup_steps=0), "optim.warmup_steps"),
    (lambda: RunConfig(steps=0), "run.steps"),
    (lambda: Config(data=DataConfig(batch_size=10), optim=OptimConfig(accum_steps=3)),
     "optim.accum_steps"),
    (lambda: from_preset("huge-L99"), "preset"),
    (lambda: depth_family("1B"), "preset"),
])
def test_invalid_configs_name_the_field(make, field):
    with pytest.raises(ConfigError) as e:
        make()
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_valid_accum_and_heads():
    c = Config(data=DataConfig(batch_size=12), optim=OptimConfig(accum_steps=3))
    assert c.optim.accum_steps == 3
    m = ModelConfig(d_model=192, n_heads=0)
    assert (m.heads, m.head_dim) == (3, 64)


# ----------------------------------------------------------------------------- CLI

def test_cli_preset_then_overrides_regardless_of_order():
    cfg = parse_args(["--model.n_layers", "4", "--optim.lr=0.1", "--preset", "tiny-L3"])
    assert cfg.preset == "tiny-L3"
    # tiny class: d_model 64, vocab 512; d_ff of the 3-layer member by hand: 256 - 342/3 = 142
    assert cfg.model.d_model == 64 and cfg.model.vocab_size == 512
    assert cfg.model.d_ff == 142
    assert cfg.model.n_layers == 4  # override beats the preset even though given first
    assert cfg.optim.lr == 0.1
    assert cfg.optim.name == "adafactor"  # tiny presets keep the default optimizer
    assert cfg.data == DataConfig()


def test_cli_paper_preset_training_settings():
    cfg = parse_args(["--preset", "134M-L21"])
    assert cfg.model.d_ff == 731 and cfg.model.n_layers == 21 and cfg.model.d_model == 768
    assert (cfg.optim.name, cfg.optim.schedule, cfg.optim.warmup_steps) == ("adafactor", "rsqrt", 10000)
    assert (cfg.data.seq_len, cfg.data.batch_size) == (1024, 128)


def test_cli_later_override_wins():
    cfg = parse_args(["--model.n_layers", "2", "--model.n_layers=5"])
    assert cfg.model.n_layers == 5
    cfg = parse_args(["--preset", "tiny-L2", "--preset=small-L3"])
    assert cfg.preset == "small-L3" and cfg.model.n_layers == 3 and cfg.model.d_model == 128


@pytest.mark.parametrize("raw,val", [("true", True), ("False", False), ("1", True), ("0", False),
                                     ("yes", True), ("NO", False)])
def test_cli_bools(raw, val):
    assert parse_args(["--model.scan_layers", raw]).model.scan_layers is val
    assert parse_args([f"--run.progress={raw}"]).run.progress is val


def test_cli_types():
    cfg = parse_args(["--model.dropout", "0.25", "--data.corpus", "a.txt,b.jsonl",
                      "--model.compute_dtype", "bfloat16", "--mesh.data", "-1"])
    assert cfg.model.dropout == 0.25 and isinstance(cfg.model.dropout, float)
    assert cfg.data.corpus == "a.txt,b.jsonl"
    assert cfg.model.compute_dtype == "bfloat16"
    assert cfg.mesh.data == -1


@pytest.mark.parametrize("argv,field", [
    (["--model.n_layer", "3"], "model.n_layer"),
    (["--modle.n_layers", "3"], "modle.n_layers"),
    (["--model.n_layers", "three"], "model.n_layers"),
    (["--model.n_layers", "2.5"], "model.n_layers"),
    (["--optim.lr", "fast"], "optim.lr"),
    (["--model.scan_layers", "maybe"], "model.scan_layers"),
    (["--model.n_layers", "0"], "model.n_layers"),      # parses, then fails validation
    (["--model.remat=sometimes"], "model.remat"),
    (["--preset", "nope"], "preset"),
])
def test_cli_errors_name_the_field(argv, field):
    with pytest.raises(ConfigError) as e:
        parse_args(argv)
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_cli_missing_value_and_positional():
    with pytest.raises(ConfigError, match="model.n_layers"):
        parse_args(["--model.n_layers"])
    with pytest.raises(ConfigError):
        parse_args(["model.n_layers", "3"])


def test_config_roundtrip_dict_and_json(tmp_path):
    cfg = parse_args(["--preset", "small-L6", "--optim.lr", "0.002", "--model.dropout", "0.1",
                      "--run.progress", "false", "--optim.schedule", "linear"])
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert Config.from_dict(json.loads(cfg.to_json())) == cfg
    path = tmp_path / "cfg.json"
    path.write_text(cfg.to_json())
    back = parse_args(["--config", str(path)])
    assert back == cfg
    assert back.preset == "small-L6" and back.model.d_ff == depth_family_dff(128, 4, 512, 6)
    # overrides apply on top of the saved config
    again = parse_args(["--config", str(path), "--run.seed", "7"])
    assert again.run.seed == 7 and again.optim.lr == 0.002 and again.model == cfg.model


def test_cli_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="^config:"):
        parse_args(["--config", str(tmp_path / "missing.json")])
    # the message starts with file:line, like a compiler's
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(bad))}:1: not valid JSON"):
        parse_args(["--config", str(bad)])
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"model": {"n_layerz": 3}}))
    with pytest.raises(ConfigError, match=f"^{re.escape(str(unknown))}:1: model: unknown fields"):
        parse_args(["--config", str(unknown)])


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--model.n_layers", "3", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--model.n_layers" in out and "--optim.lr" in out and "tiny-L3" in out
    # every field says what it means, under its name: the comment beside or above it
    lines = out.split("\n")
    for sec, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.init:
                at = next(i for i, line in enumerate(lines)
                          if line.startswith(f"  --{sec}.{f.name} "))
                assert lines[at + 1].startswith("      ") and lines[at + 1].strip(), f"{sec}.{f.name}"
    at = lines.index(next(line for line in lines if line.startswith("  --act.halting_bias_init")))
    assert lines[at + 1].split() == ["b_h", "at", "init:", "<", "0", "starts", "every", "token",
                                     "at", "M", "(act-cpu);", "tests", "and", "benchmarks", "also",
                                     "move", "it", "to"]
    assert ("      streaming: loader processes per host; 0 = a thread of the trainer; read by run "
            "kind: lm" in lines)
    # a registry's choices and readers, and whether a resume may change the field
    text = " ".join(out.split())
    assert "--optim.name str the run kind's recipe one class each: jaxdepth/optim.py; " \
           "choices: adafactor, adamw, lamb, lion" in text
    assert "--optim.eps float the run kind's recipe added to the root of the second moment; " \
           "read by optim.name: adamw, lamb --optim" in text
    assert "--mesh.fsdp bool default False also shard parameters and optimizer state over the " \
           "data axis; may change when a run resumes --mesh" in text
    assert "--optim.lr float the run kind's recipe adafactor: relative to each parameter's RMS " \
           "--optim" in text


def test_fusion_method_is_checked_when_parsed_and_listed_from_its_registry(tmp_path, capsys):
    """Every class of models/fusions/ is a choice of fusion.method, in --help and on the
    command line or in a --config file, refused there (naming the field) by any other name."""
    from jaxdepth.config.help import help_text
    from jaxdepth.models.fusions import fusion_methods

    names = fusion_methods()
    assert set(names) == {"base", "base+n", "concat", "dwatt", "scalar_mix"}
    assert f"choices: {', '.join(names)};" in " ".join(help_text().split())
    ner = ["--task.name", "ner", "--task.dir", str(tmp_path), "--model.arch", "encoder"]
    assert parse_args(ner + ["--fusion.method", "scalar_mix"]).fusion.method == "scalar_mix"
    with pytest.raises(ConfigError, match=re.escape(
            f"fusion.method: must be one of {', '.join(names)}, got 'bogus'")):
        parse_args(ner + ["--fusion.method", "bogus"])
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"task": {"name": "ner", "dir": str(tmp_path)},
                                 "model": {"arch": "encoder"},
                                 "fusion": {"method": "bogus"}}, indent=1))
    line = 1 + next(i for i, t in enumerate(saved.read_text().splitlines()) if '"bogus"' in t)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(saved))}:{line}: fusion.method: must"):
        parse_args(["--config", str(saved)])


def test_a_fusion_setting_is_read_by_the_methods_that_declare_it(tmp_path):
    """fusion.extra_layers is Base+n's alone (``BasePlusN.READS``): given with another
    method it is refused (on the command line, in a --config file, in a config built in
    code), naming its reader, instead of being silently unused; --help names the reader from
    the declaration."""
    from jaxdepth.config.help import help_text

    ner = ["--task.name", "ner", "--task.dir", str(tmp_path), "--model.arch", "encoder"]
    assert parse_args(ner + ["--fusion.method", "base+n", "--fusion.extra_layers", "2"]
                      ).fusion.extra_layers == 2
    for method in ("base", "scalar_mix", "concat", "dwatt"):
        with pytest.raises(ConfigError, match=rf"^fusion.extra_layers: fusion.method {method} "
                                              rf"does not read it \(read by: base\+n\)$"):
            parse_args(ner + ["--fusion.method", method, "--fusion.extra_layers", "2"])
        assert parse_args(ner + ["--fusion.method", method, "--fusion.extra_layers", "1"]
                          ).fusion.method == method  # its default: nothing is lost
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"task": {"name": "ner", "dir": str(tmp_path)},
                                 "model": {"arch": "encoder"},
                                 "fusion": {"method": "concat", "extra_layers": 3},
                                 "version": 5}))
    with pytest.raises(ConfigError, match="fusion.extra_layers: fusion.method concat does not"):
        parse_args(["--config", str(saved)])
    with pytest.raises(ConfigError, match="^fusion.extra_layers: fusion.method concat does not"):
        apply_overrides(Config(), {"fusion": {"method": "concat", "extra_layers": 3}})
    # Up to layout 4 the few-shot grid saved it for every method: read back, it is dropped
    # where the method never read it, and kept for Base+n
    v4 = json.loads(saved.read_text())
    assert Config.from_dict({**v4, "version": 4}).fusion == FusionConfig(method="concat")
    v4["fusion"]["method"] = "base+n"
    assert Config.from_dict({**v4, "version": 4}).fusion.extra_layers == 3
    assert "--fusion.extra_layers int default 1 n of base+n; read by fusion.method: base+n;" \
        in " ".join(help_text().split())


def test_field_docs_reads_the_comment_beside_and_above_each_field():
    from jaxdepth.config.help import field_docs

    @dataclasses.dataclass(frozen=True)
    class Sample:
        a: int = 1  # beside a
        # above b, line one
        # line two
        b: str = "x#not a comment"
        c: float = 0.0
        d: bool = False  # beside d

    assert field_docs(Sample) == {"a": "beside a", "b": "above b, line one line two", "c": "",
                                  "d": "beside d"}


def test_resume_check_treats_fields_added_later_as_their_defaults(tmp_path):
    """A checkpoint written before a config field existed (e.g. the fusion section) resumes
    when the field is still at its default, and is refused, naming the field, otherwise."""
    from jaxdepth.trainer.restore import check_compatible

    old = Config().to_dict()
    old.pop("fusion")
    old["task"].pop("n_shot")
    check_compatible(old, Config(), tmp_path)
    changed = apply_overrides(Config(), {"fusion": {"method": "concat"}})
    with pytest.raises(ConfigError, match="^fusion.method: .*checkpoint 'dwatt' vs now 'concat'"):
        check_compatible(old, changed, tmp_path)
    with pytest.raises(ConfigError, match="^model.d_model"):
        check_compatible(old, apply_overrides(Config(), {"model": {"d_model": 64}}), tmp_path)


# ----------------------------------------------------------------- one section per architecture

@pytest.mark.parametrize("arch, over, culprit, hint", [
    ("act", {"model": {"vocab_size": 1000}}, "model.vocab_size", "set act.vocab_size instead"),
    ("bert", {"model": {"z_loss": 1e-4}}, "model.z_loss", "read for model.arch decoder, encoder only"),
    ("decoder", {"act": {"tau": 0.1}}, "act.tau", "read for model.arch act, albert, bert only"),
    ("encoder", {"act": {"d_model": 64}}, "act.d_model", "set model.d_model instead"),
])
def test_the_section_model_arch_does_not_read_is_refused(arch, over, culprit, hint):
    base = apply_overrides(Config(), {"model": {"arch": arch}})
    with pytest.raises(ConfigError, match=f"^{re.escape(culprit)}: .*{re.escape(hint)}") as e:
        apply_overrides(base, over)
    assert e.value.field == culprit


def test_one_section_describes_the_model_and_config_json_holds_only_it():
    act = apply_overrides(from_preset("act-tiny"), {"act": {"vocab_size": 300}})
    assert (act.vocab_size, act.vocab_field) == (300, "act.vocab_size")
    d = act.to_dict()
    assert d["model"] == {"arch": "act"} and d["act"]["vocab_size"] == 300
    dec = apply_overrides(Config(), {"model": {"vocab_size": 200}})
    assert (dec.vocab_size, dec.vocab_field) == (200, "model.vocab_size")
    assert "act" not in dec.to_dict() and dec.to_dict()["model"]["vocab_size"] == 200
    for cfg in (act, dec):
        assert Config.from_dict(json.loads(cfg.to_json())) == cfg


def test_version_1_configs_are_upgraded():
    """Before MODEL_SECTION an ACT run read its vocabulary from model.vocab_size and every
    section was written: the upgrade keeps what the run used and drops what it ignored."""
    old_act = {"model": {**vars(ModelConfig(vocab_size=777, d_model=64)), "arch": "albert"},
               "act": {"vocab_size": 512, "d_model": 32, "n_heads": 2, "tau": 5e-4}}
    cfg = Config.from_dict(old_act)
    assert cfg.version == 5 and cfg.model == ModelConfig(arch="albert")
    assert (cfg.act.vocab_size, cfg.act.d_model, cfg.act.tau) == (777, 32, 5e-4)
    old_dec = {"model": {"d_model": 64}, "act": {"tau": 0.5, "d_model": 32}}
    cfg = Config.from_dict(old_dec)
    assert cfg.model.d_model == 64 and cfg.act == Config().act
    # the current layout is read as written: the same dicts with version 2 are refused
    with pytest.raises(ConfigError, match="^act.d_model: model.arch='decoder'"):
        Config.from_dict({**old_dec, "version": 2})
    with pytest.raises(ConfigError, match="^version: must be 1, 2, 3, 4 or 5, got 6"):
        Config.from_dict({"version": 6})


def test_version_2_configs_drop_the_moments_their_optimizer_does_not_read():
    """Version 2 saved optim.b1, b2 and eps whatever the optimizer (Adafactor's runs held
    values it never read); today a config that sets them for Adafactor is refused, so a saved
    one is upgraded on reading, and the values an optimizer reads are kept."""
    v2 = {**Config().to_dict(), "version": 2}
    v2["optim"] = {**v2["optim"], "b1": 0.9, "b2": 0.99, "eps": 1e-8}
    cfg = Config.from_dict(v2)
    assert (cfg.optim.name, cfg.optim.b1, cfg.optim.b2, cfg.optim.eps) == ("adafactor", None, None, None)
    assert cfg.version == 5 and cfg == Config()
    with pytest.raises(ConfigError, match="^optim.b1: optim.name adafactor does not read it"):
        Config.from_dict({**v2, "version": 5})  # today's layout: refused, not dropped
    lamb = {**v2, "optim": {**v2["optim"], "name": "lamb", "b2": 0.98, "eps": 1e-6}}
    assert (Config.from_dict(lamb).optim.b2, Config.from_dict(lamb).optim.eps) == (0.98, 1e-6)


def test_the_decoder_s_own_model_fields_are_refused_for_another_architecture():
    """model.rel_buckets and the other decoder-only fields (declared in ``archs.Decoder.READS``) are
    refused for the BERT encoder, naming the field and who reads it; the act/albert/bert
    encoders are described by the act section, so any model field is refused there."""
    from jaxdepth.config.cli import parse_args

    for name, value in (("rel_buckets", "16"), ("rel_max_distance", "64"),
                        ("compute_dtype", "bfloat16"), ("attention", "dot_product"),
                        ("scan_unroll", "2"), ("d_ff_multiple", "128")):
        with pytest.raises(ConfigError, match=rf"^model.{name}: model.arch encoder does not "
                                              rf"read it \(read by: decoder\)"):
            parse_args(["--model.arch", "encoder", f"--model.{name}", value])
        assert getattr(parse_args([f"--model.{name}", value]).model, name) == type(
            getattr(ModelConfig(), name))(value)
    assert parse_args(["--model.arch", "encoder", "--model.d_ff", "64"]).model.d_ff == 64
    with pytest.raises(ConfigError, match="^model.rel_buckets: model.arch='act' is described"):
        parse_args(["--model.arch", "act", "--model.rel_buckets", "16"])


def test_a_fusion_run_over_a_source_reads_no_model_field():
    """Over task.init_from the backbone's shape and options are its source's: a model or act
    field given to the fusion run is refused, not silently dropped; without a source the
    backbone is built from them and they are read."""
    from jaxdepth.config.cli import parse_args

    for task in (["--task.name", "ner", "--task.dir", "x"], ["--task.name", "mlm"]):
        with pytest.raises(ConfigError, match=r"^model.dropout: a (ner|mlm) run over "
                                              r"task.init_from \(runs/b\) takes its backbone"):
            parse_args([*task, "--task.init_from", "runs/b", "--model.dropout", "0.1"])
        assert parse_args([*task, "--model.dropout", "0.1"]).model.dropout == 0.1
        assert parse_args([*task, "--task.init_from", "runs/b",
                           "--model.arch", "encoder"]).model.arch == "encoder"


def test_version_3_configs_drop_the_model_fields_they_never_read():
    v3 = {**Config().to_dict(), "version": 3}
    enc = {**v3, "model": {**v3["model"], "arch": "encoder", "rel_buckets": 16, "d_ff": 64}}
    cfg = Config.from_dict(enc)
    assert (cfg.version, cfg.model.rel_buckets, cfg.model.d_ff) == (5, 32, 64)
    with pytest.raises(ConfigError, match="^model.rel_buckets: model.arch encoder does not "):
        Config.from_dict({**enc, "version": 5})
    fused = {**v3, "task": {**v3["task"], "name": "mlm", "init_from": "runs/b"},
             "model": {**v3["model"], "arch": "encoder", "dropout": 0.1}}
    cfg = Config.from_dict(fused)
    assert (cfg.model.arch, cfg.model.dropout) == ("encoder", 0.0)
    dec = {**v3, "model": {**v3["model"], "rel_buckets": 16}}  # read: kept
    assert Config.from_dict(dec).model.rel_buckets == 16


def test_a_version_1_checkpoint_config_resumes(tmp_path):
    from jaxdepth.trainer.restore import check_compatible

    now = from_preset("act-tiny")
    old = {**now.to_dict(), "model": {**vars(ModelConfig()), "arch": "act"}}
    old.pop("version")
    check_compatible(old, now, tmp_path)
    with pytest.raises(ConfigError, match="^act.vocab_size: .*checkpoint 512 vs now 300"):
        check_compatible(old, apply_overrides(now, {"act": {"vocab_size": 300}}), tmp_path)


def test_which_changes_a_resume_accepts_is_declared_with_each_field(tmp_path):
    """config.resumable marks the fields a resumed run may change (how long and how visibly it
    trains, where, and how the same computation is laid out); every other difference refuses."""
    from jaxdepth.config import resumable_fields
    from jaxdepth.trainer.restore import check_compatible

    run = {"dir", "steps", "log_every", "eval_every", "eval_batches", "save_every", "keep",
           "samples", "sample_tokens", "grammar_samples", "progress", "stop_after"}
    assert resumable_fields() == {
        *(f"run.{f}" for f in run),
        *(f"mesh.{f}" for f in ("data", "model", "fsdp", "coordinator", "num_processes",
                                "process_id")),
        *(f"model.{f}" for f in ("remat", "scan_layers", "scan_unroll", "xent_chunk",
                                 "attention", "d_ff_multiple")),
        "task.eval_splits", "task.eval_max", "task.eval_batch", "data.restart_stream",
        "trials.evaluation"}
    saved = Config().to_dict()
    check_compatible(saved, apply_overrides(Config(), {"run": {"steps": 800},
                                                       "model": {"remat": "full"}}), tmp_path)
    with pytest.raises(ConfigError, match=r"^optim\.lr: cannot resume .* with a different config "
                                          r"\(optim\.lr: checkpoint 0\.06 vs now 0\.1\)"):
        check_compatible(saved, apply_overrides(Config(), {"optim": {"lr": 0.1}}), tmp_path)


@pytest.mark.parametrize("argv, culprit", [
    (["--fusion.method", "concat"], r"fusion\.method: run kind lm does not read it \(read by: ner, mlm\)"),
    (["--fusion.cache", "false"], r"fusion\.cache: run kind lm"),
    (["--task.n_shot", "8"], r"task\.n_shot: run kind lm does not read it \(read by: ner\)"),
    (["--trials.fusion_dropout", "0.0,0.1"],
     r"trials\.fusion_dropout \(varies fusion\.dropout\): run kind lm"),
    (["--task.eval_max", "8"], r"task\.eval_max: run kind lm does not read it \(read by: prefix_lm, ner\)"),
    (["--task.name", "ner", "--task.dir", "d", "--model.arch", "encoder", "--task.n_train", "9"],
     r"task\.n_train: run kind ner does not read it \(read by: prefix_lm, probe\)"),
    (["--preset", "act-tiny", "--task.name", "tense", "--task.n_shot", "2"],
     r"task\.n_shot: run kind probe does not read it"),
    (["--data.mask_rate", "0.2"],
     r"data\.mask_rate: run kind lm does not read it \(read by: encoder_pretrain, "
     r"encoder_mlm, mlm\)"),
    (["--task.name", "ner", "--task.dir", "d", "--data.max_ngram", "2"],
     r"data\.max_ngram: run kind ner"),
    (["--preset", "act-tiny", "--data.streaming", "true"],
     r"data\.streaming: run kind encoder_pretrain does not read it \(read by: lm\)"),
    (["--task.name", "semantic_parsing", "--data.restart_stream", "true"],
     r"data\.restart_stream: run kind prefix_lm"),
    # a pretraining given a run to start from trained from fresh weights
    (["--task.init_from", "runs/default"],
     r"task\.init_from: run kind lm does not read it \(read by: prefix_lm, probe, ner, mlm\)"),
    (["--task.name", "semantic_parsing", "--run.samples", "0"],
     r"run\.samples: run kind prefix_lm does not read it \(read by: lm\)"),
    (["--task.name", "ner", "--task.dir", "d", "--data.corpus", "my.txt"],
     r"data\.corpus: run kind ner does not read it"),
    (["--preset", "act-tiny", "--task.name", "roles", "--data.valid_fraction", "0.2"],
     r"data\.valid_fraction: run kind probe"),
    (["--task.dir", "d"], r"task\.dir: run kind lm does not read it \(read by: prefix_lm, ner\)"),
    (["--model.arch", "encoder", "--model.z_loss", "1e-4"],
     r"model\.z_loss: run kind encoder_mlm does not read it \(read by: lm, prefix_lm\)"),
])
def test_a_field_the_run_kind_does_not_read_is_refused(argv, culprit):
    """Given on the command line, a field the run's kind never reads is refused, naming it
    and the kinds that read it, where it was silently ignored (the last --preset wins)."""
    with pytest.raises(ConfigError, match=culprit):
        parse_args(["--preset", "tiny-L2", *argv])


def test_a_field_is_checked_only_where_the_user_gave_it(tmp_path):
    """The kinds that read a field take it; a config file (a run's config.json holds every
    section it was built with) or a preset is not checked field by field."""
    ner = parse_args(["--task.name", "ner", "--task.dir", "d", "--model.arch", "encoder",
                      "--fusion.method", "concat", "--task.n_shot", "8"])
    assert (ner.fusion.method, ner.task.n_shot) == ("concat", 8)
    mlm = parse_args(["--task.name", "mlm", "--model.arch", "encoder", "--fusion.mode", "ft",
                      "--data.mask_rate", "0.2"])
    assert (mlm.fusion.mode, mlm.data.mask_rate) == ("ft", 0.2)
    assert parse_args(["--data.streaming", "true", "--data.corpus", "a.jsonl"]).data.streaming
    probe = parse_args(["--preset", "act-tiny", "--task.name", "roles", "--task.seed", "3",
                        "--data.grammar_docs", "300", "--task.init_from", "runs/act-tiny"])
    assert (probe.task.seed, probe.data.grammar_docs) == (3, 300)
    saved = dataclasses.replace(Config(), fusion=dataclasses.replace(Config().fusion,
                                                                     method="concat"))
    path = tmp_path / "c.json"
    path.write_text(json.dumps(saved.to_dict()))
    lm = parse_args(["--config", str(path), "--run.steps", "3"])
    assert lm.fusion.method == "concat" and lm.run.steps == 3


_NER = ["--task.name", "ner", "--task.dir", "d", "--model.arch", "encoder"]
_SHADOWED = [  # (command line, the field given, the list that sets it for every trial)
    (["--optim.lr", "0.01", "--trials.lr", "1e-3,2e-3"], "optim.lr", "trials.lr"),
    (["--trials.weight_decay", "0,0.1", "--optim.weight_decay", "0.01"],
     "optim.weight_decay", "trials.weight_decay"),
    (["--task.name", "semantic_parsing", "--task.seed", "3", "--trials.task_seed", "1,2"],
     "task.seed", "trials.task_seed"),
    # "seed": each trial's task.seed is its run.seed
    (["--task.name", "semantic_parsing", "--task.seed", "3", "--trials.task_seed", "seed",
      "--run.seeds", "0,1"], "task.seed", "trials.task_seed"),
    ([*_NER, "--task.n_shot", "4", "--trials.n_shot", "2,4"], "task.n_shot", "trials.n_shot"),
    (["--model.dropout", "0.1", "--trials.dropout", "0,0.1"], "model.dropout", "trials.dropout"),
    (["--preset", "act-tiny", "--act.dropout", "0.1", "--trials.act_dropout", "0,0.1"],
     "act.dropout", "trials.act_dropout"),
    ([*_NER, "--fusion.dropout", "0.2", "--trials.fusion_dropout", "0,0.1"],
     "fusion.dropout", "trials.fusion_dropout"),
    (["--preset", "act-tiny", "--trials.tau", "0,1e-4", "--act.tau", "1e-3"], "act.tau", "trials.tau"),
    (["--run.seed", "3", "--run.seeds", "0,1"], "run.seed", "run.seeds"),
    (["--run.seed", "3", "--run.seeds", "0"], "run.seed", "run.seeds"),  # a one-trial grid too
]


@pytest.mark.parametrize("argv, given, varied", _SHADOWED, ids=[c[1] for c in _SHADOWED])
def test_a_field_given_with_the_list_that_sets_it_per_trial_is_refused(argv, given, varied):
    """The trials' list sets the field in every trial, so a value given for the field itself
    would go unused: both given is refused, naming both, where the value was silently dropped."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(given)}: given with "
                                          rf"{re.escape(varied)}, which sets it for every "
                                          rf"trial; give one of them$") as e:
        parse_args(argv)
    assert e.value.field == given


def test_every_trials_list_is_checked_against_the_field_it_sets():
    from jaxdepth.config.trials import TRIAL_FIELDS
    assert {g for _, g, _ in _SHADOWED} == {f for f, _ in TRIAL_FIELDS.values()} | {"run.seed"}


def test_a_trials_list_conflicts_only_with_a_field_the_user_gave(tmp_path):
    """A config file or a preset holds every field, so what it sets does not conflict with a
    trials list; a field given on the command line does, wherever the list comes from."""
    from jaxdepth.config.trials import trial_configs
    path = tmp_path / "c.json"
    path.write_text(Config().to_json())  # optim.lr and run.seed among every field
    cfg = parse_args(["--config", str(path), "--trials.lr", "1e-3,2e-3", "--run.seeds", "0,1"])
    assert [(c.optim.lr, c.run.seed) for c in trial_configs(cfg)] == \
        [(1e-3, 0), (1e-3, 1), (2e-3, 0), (2e-3, 1)]
    ft = parse_args(["--preset", "tiny-L2+finetune", "--task.name", "semantic_parsing",
                     "--trials.lr", "1e-4,1e-3", "--trials.dropout", "0,0.2"])  # sets both
    assert [(c.optim.lr, c.model.dropout) for c in trial_configs(ft)] == \
        [(1e-4, 0.0), (1e-4, 0.2), (1e-3, 0.0), (1e-3, 0.2)]
    path.write_text(cfg.to_json())  # a run with trials: its list in the file
    assert len(trial_configs(parse_args(["--config", str(path)]))) == 4
    with pytest.raises(ConfigError, match=r"^optim\.lr: given with trials\.lr, which sets it"):
        parse_args(["--config", str(path), "--optim.lr", "0.01"])
    # an emptied list sets nothing
    assert parse_args(["--config", str(path), "--optim.lr", "0.01", "--trials.lr", "",
                       "--run.seeds", ""]).optim.lr == 0.01


def test_help_names_the_run_kinds_of_a_field(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--task.n_shot int default 0 ner: train on N * C sentences" in text
    assert "run kind: ner;" not in text and "(C entity types); 0: all; read by run kind: ner" in text
    assert "--fusion.cache_mib int default 2048" in text
    assert text.count("read by run kind: ner, mlm") == 6
