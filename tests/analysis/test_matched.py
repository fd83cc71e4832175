"""Perplexity-matched checkpoints and equal-loss evaluation points, from synthetic logs."""
import json

import pytest

from jaxdepth.analysis import matched
from jaxdepth.files import read_jsonl


def final_value(rows, key):
    """key's value at the largest step that records it."""
    c = matched.curve(rows, key)
    if not c:
        raise ValueError(f"no row records {key!r}")
    return c[-1][1]



def _write(path, rows, torn=True):
    lines = [json.dumps(r) for r in rows]
    if torn:
        lines.append('{"step": 999, "valid_lo')  # a crash mid-write
    path.write_text("\n".join(lines) + "\n")
    return path


# A pretraining log that was resumed from step 200: steps 300/400 were logged twice and the
# later lines win. Training rows carry no valid_ppl.
METRICS = [
    {"step": 100, "loss": 3.0},
    {"step": 100, "valid_loss": 2.5, "valid_ppl": 12.0},
    {"step": 200, "valid_loss": 2.3, "valid_ppl": 10.0},
    {"step": 300, "valid_loss": 2.2, "valid_ppl": 9.5},
    {"step": 400, "valid_loss": 2.1, "valid_ppl": 8.0},
    {"step": 300, "valid_loss": 2.25, "valid_ppl": 9.7},  # after resume
    {"step": 400, "valid_loss": 2.15, "valid_ppl": 8.5},
    {"step": 410, "loss": 2.0},
]


def test_read_jsonl_and_curve(tmp_path):
    rows = read_jsonl(_write(tmp_path / "metrics.jsonl", METRICS))
    assert rows == METRICS  # torn line dropped, everything else kept in order
    assert matched.curve(rows, "valid_ppl") == [(100, 12.0), (200, 10.0), (300, 9.7), (400, 8.5)]
    assert matched.curve(rows, "loss") == [(100, 3.0), (410, 2.0)]
    assert final_value(rows, "valid_ppl") == 8.5
    assert matched.curve(rows, "nothing") == []
    with pytest.raises(ValueError):
        final_value(rows, "nothing")


def test_read_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_read_jsonl_skips_a_line_torn_inside_a_multi_byte_character(tmp_path):
    path = tmp_path / "evals.jsonl"
    path.write_bytes(b'{"step": 1, "text": "ok"}\n' + '{"step": 2, "text": "é'.encode()[:-1])
    assert read_jsonl(path) == [{"step": 1, "text": "ok"}]

def test_matched_checkpoint_rules():
    ppl = [(100, 12.0), (200, 10.0), (300, 9.0), (400, 7.0), (500, 6.0)]
    # 300 is the first logged step at or below 9.5 but was not saved; 400 is the first saved.
    assert matched.matched_checkpoint(9.5, ppl, saved_steps=[100, 200, 400, 500]) == 400
    # Not the best one: 500 is lower but later.
    assert matched.matched_checkpoint(9.5, ppl, saved_steps=[500, 400, 300]) == 300
    # Equality counts.
    assert matched.matched_checkpoint(10.0, ppl, saved_steps=[100, 200, 300]) == 200
    # A saved step with no recorded perplexity is skipped.
    assert matched.matched_checkpoint(9.5, ppl, saved_steps=[250, 500]) == 500
    # Nothing reaches it.
    assert matched.matched_checkpoint(5.0, ppl, saved_steps=[100, 200, 300, 400, 500]) is None
    assert matched.matched_checkpoint(9.5, ppl, saved_steps=[]) is None


def test_perplexity_matched_three_runs(tmp_path):
    # Depth 1 ends at ppl 9.0 (step 300); depth 2 first reaches it at saved step 200 (its
    # logged step 150 is lower but was not saved); depth 4 never does.
    runs = {
        4: {"metrics_rows": [{"step": 100, "valid_ppl": 11.0}, {"step": 200, "valid_ppl": 9.5}],
            "saved_steps": [100, 200]},
        1: {"metrics_rows": [{"step": 100, "valid_ppl": 12.0}, {"step": 200, "valid_ppl": 10.0},
                             {"step": 300, "valid_ppl": 9.0}],
            "saved_steps": [100, 200, 300]},
        2: {"metrics_rows": read_jsonl(_write(tmp_path / "m2.jsonl", [
                {"step": 100, "valid_ppl": 10.5}, {"step": 150, "valid_ppl": 8.9},
                {"step": 200, "valid_ppl": 8.0}, {"step": 300, "valid_ppl": 7.0},
                {"step": 200, "valid_ppl": 8.7}])),
            "saved_steps": [100, 200, 300]},
    }
    got = matched.perplexity_matched(runs)
    assert got == {"reference_depth": 1, "reference_ppl": 9.0,
                   "steps": {1: 300, 2: 200, 4: None}}
    # Against depth 4's final 9.5: depth 1 reaches it at 300, depth 2 at 200.
    got = matched.perplexity_matched(runs, reference_depth=4)
    assert got == {"reference_depth": 4, "reference_ppl": 9.5,
                   "steps": {1: 300, 2: 200, 4: 200}}
    with pytest.raises(ValueError):
        matched.perplexity_matched(runs, reference_depth=3)


def _eval(step, loss, gen):
    return {"step": step, "dev_loss": loss,
            "accuracy": {"dev": {"overall": 1.0 - loss}, "gen": {"overall": gen}}}


def test_common_threshold_and_first_at_or_below():
    curves = {"a": [(1, 0.9), (2, 0.5), (3, 0.2)], "b": [(1, 0.8), (2, 0.4), (3, 0.45)]}
    assert matched.common_threshold(curves) == 0.4
    assert matched.first_at_or_below(curves["a"], 0.4) == 3
    assert matched.first_at_or_below(curves["b"], 0.4) == 2
    assert matched.first_at_or_below(curves["b"], 0.1) is None
    assert matched.first_at_or_below([(5, 0.3), (2, 0.35)], 0.4) == 2  # step order, not list order


def test_equal_loss_points(tmp_path):
    shallow = [_eval(100, 0.9, 0.1), _eval(200, 0.5, 0.2), _eval(300, 0.3, 0.25),
               {"step": 310, "loss": 0.01}]  # training row: no dev_loss
    deep_path = _write(tmp_path / "evals.jsonl", [
        _eval(100, 0.7, 0.2), _eval(200, 0.45, 0.35), _eval(300, 0.35, 0.4),
        _eval(200, 0.4, 0.3)])  # resumed: step 200 re-evaluated, the later row wins
    deep = read_jsonl(deep_path)
    got = matched.equal_loss_points({"shallow": shallow, "deep": deep})
    # min(shallow) = 0.3, min(deep) = 0.35 -> threshold 0.35
    assert got["shallow"]["threshold"] == got["deep"]["threshold"] == 0.35
    assert got["shallow"]["step"] == 300
    assert got["deep"]["step"] == 300
    assert got["deep"]["row"]["accuracy"]["gen"]["overall"] == 0.4

    got = matched.equal_loss_points({"shallow": shallow, "deep": deep}, threshold=0.45)
    assert got["shallow"]["step"] == 300
    assert got["deep"]["step"] == 200
    assert got["deep"]["row"]["dev_loss"] == 0.4  # the later row for step 200
    assert got["deep"]["row"]["accuracy"]["gen"]["overall"] == 0.3

    got = matched.equal_loss_points({"shallow": shallow}, threshold=0.1)
    assert got["shallow"] == {"threshold": 0.1, "step": None, "row": None}
