"""benchmarks/bench_fusion.py on a tiny backbone: every method x mode is timed, the times are
finite and positive, and the reported checks are the ratios of the reported times. The speed
targets themselves are not asserted (timing is noisy on shared CI machines)."""
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_fusion  # noqa: E402

METHODS = ("base", "dwatt")  # the target's pair: two methods keep the compiles few
MODES = ("fe", "ft")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_fusion") / "fusion.json"
    res = bench_fusion.main(["--d-model", "16", "--layers", "1", "--heads", "2", "--seq-len", "8",
                             "--batch", "8", "--labelled", "2", "--repeats", "1",
                             "--data-devices", "1", "--methods", *METHODS, "--out", str(out)])
    return res, json.loads(out.read_text())


def _positive_finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_json_written_and_matches(result):
    res, disk = result
    assert disk["benchmark"] == "bench_fusion"
    assert disk["step_s"] == res["step_s"]
    # (as JSON text: a ratio is NaN when the backbone's measured backward is not positive)
    assert json.dumps(disk["checks"], sort_keys=True) == json.dumps(res["checks"], sort_keys=True)
    assert disk["d_model"] == 16 and disk["n_layers"] == 1
    assert disk["seq_len"] == 8 and disk["batch"] == 8 and disk["labelled"] == 2
    assert disk["positions"] == [1, 3]  # first sub-tokens: every other position after [CLS]
    assert disk["same_backbone_all_configs"] is True


def test_every_method_and_mode_timed(result):
    disk = result[1]
    want = {f"{mode}/{m}" for m in METHODS for mode in MODES}
    assert set(disk["step_s"]) == want
    for name in want:
        assert _positive_finite(disk["step_s"][name]), name
        assert len(disk["step_s_all"][name]) == 1
        assert math.isfinite(disk["initial_loss"][name])
    bb = disk["backbone"]
    assert _positive_finite(bb["forward_s"]) and _positive_finite(bb["value_and_grad_s"])
    assert math.isfinite(bb["backward_s"])
    assert bb["backward_s"] == pytest.approx(bb["value_and_grad_s"] - bb["forward_s"])
    assert disk["backbone_backward_s"] == bb["backward_s"]


def test_ratios_are_recomputed_from_times(result):
    disk = result[1]
    t, c = disk["step_s"], disk["checks"]
    ratio = t["fe/dwatt"] / t["fe/base"]
    assert c["dwatt_fe_over_base_fe"] == pytest.approx(ratio)
    assert c["dwatt_fe_within_target"] == (ratio <= 1.10)
    bwd = disk["backbone_backward_s"]
    assert set(c["ft_minus_fe"]) == set(METHODS)
    for m in METHODS:
        r = c["ft_minus_fe"][m]
        diff = t[f"ft/{m}"] - t[f"fe/{m}"]
        assert r["ft_minus_fe_s"] == pytest.approx(diff)
        assert r["backbone_backward_s"] == bwd
        if bwd > 0:
            assert r["ratio"] == pytest.approx(diff / bwd)
        assert r["within_target"] == (diff >= bwd)
    assert c["ft_minus_fe_all_within_target"] == all(
        c["ft_minus_fe"][m]["within_target"] for m in METHODS)


def _tiny_hf_bert(directory, ner_dir):
    """A random 1-layer BERT (d 32) in Hugging Face layout whose WordPiece vocabulary is the
    words of the NER files: a backbone for --grid without the experiment's pretraining (a
    process of its own, a third of this test's time when it pretrained)."""
    from test_encoder_hf import hf_config, random_arrays
    from test_ner_job import _write_wordpiece

    from jaxdepth.data.finetune.ner_sentences import read_wikiann
    from test_encoder_hf import save_hf_checkpoint

    words = sorted({w for split in ("train", "dev", "test")
                    for s in read_wikiann(ner_dir / split) for w in s.tokens})
    sizes = (len(_write_wordpiece(directory, words)), 32, 1, 64, 128)  # V, D, L, F, P
    save_hf_checkpoint(directory, random_arrays("bert", heads=False, sizes=sizes),
                       hf_config("bert", sizes, heads=2))
    return directory


def test_grid_mode_times_both_ways_and_compares_every_unit(tmp_path, shared_data):
    """--grid on a one-unit grid (DWAtt, whose cached path packs the words in use) over a
    tiny Hugging Face encoder and the shared WikiAnn: the cached and uncached grids give the
    same results, and the reported speedup is the ratio of the reported wall times. (That the
    cache leaves every method's numbers alone is tests/tasks/test_state_cache.py's.)"""
    ner = shared_data / "wikiann" / "en"
    out = tmp_path / "grid.json"
    bert = _tiny_hf_bert(tmp_path / "bert", ner)
    res = bench_fusion.main([
        "--grid", "--ner-dir", str(ner), "--workdir", str(tmp_path / "work"), "--out", str(out),
        "--backbone", str(bert), "--grid-extra", "--methods dwatt --shots 8 --trials 1 "
        "--finetune run.steps=4 run.eval_every=2 task.eval_max=20 mesh.data=1"])
    disk = json.loads(out.read_text())
    assert disk["backbone"] == str(bert)
    assert disk["cached"]["units"] == disk["uncached"]["units"] == 1
    assert sorted(disk["cached"]["results"]) == ["dwatt N=8 trial=0"]
    assert disk["same_results_every_unit"] is True
    assert disk["cached"]["results"] == disk["uncached"]["results"]
    assert disk["speedup"] == pytest.approx(disk["uncached"]["wall_s"] / disk["cached"]["wall_s"])
    assert res["within_target"] == (res["speedup"] >= 3.0)
    # the uncached grid really ran with the cache off, the cached one with it on
    plans = {n: json.loads((tmp_path / "work" / n / "plan.json").read_text())["finetune"]
             for n in ("cached", "uncached")}
    assert plans["uncached"]["fusion.cache"] is False and "fusion.cache" not in plans["cached"]
    assert plans["cached"]["run.steps"] == plans["uncached"]["run.steps"] == 4
    assert plans["uncached"]["mesh.data"] == 1  # the rest of the --finetune list, repeated
    assert disk["drift"]["units_that_differ"] == 0
