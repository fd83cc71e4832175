"""Exact match, accuracy per type and the t-based confidence interval, checked by hand."""
import math
from dataclasses import dataclass

import pytest

from jaxdepth.analysis.exact_match import accuracy_by_type, exact_match, mean_ci95


def test_exact_match_is_on_whole_token_sequences():
    gold = "eat ( agent = * cat , theme = cake )"
    assert exact_match(gold, gold)
    assert exact_match("eat  ( agent = * cat , theme = cake ) \n", gold)  # whitespace only
    assert not exact_match("eat ( agent = * cat , theme = cake", gold)  # final token missing
    assert not exact_match(gold + " )", gold)  # one token too many
    assert not exact_match("eat ( agent = * cat , theme = cakes )", gold)
    assert not exact_match("eat ( agent = cat , theme = cake )", gold)
    assert not exact_match("", gold) and exact_match("", "")


@dataclass
class Record:
    type: str
    correct: bool


def test_accuracy_by_type_by_hand():
    records = (
        [Record("in_distribution", True)] * 3 + [Record("in_distribution", False)]
        + [Record("pp_recursion", False)] * 2 + [Record("cp_recursion", True)] * 2
        + [{"type": "subj_to_obj_common", "correct": True}]
        + [{"type": "prim_to_obj_proper", "correct": False}] * 3
        + [Record("primitive", True)]
    )
    acc = accuracy_by_type(records)
    assert acc["n"] == 13
    assert acc["overall"] == pytest.approx(7 / 13)
    assert acc["by_type"] == {"cp_recursion": 1.0, "in_distribution": 0.75,
                              "pp_recursion": 0.0, "prim_to_obj_proper": 0.0,
                              "primitive": 1.0, "subj_to_obj_common": 1.0}
    assert acc["count_by_type"]["prim_to_obj_proper"] == 3
    assert acc["in_distribution"] == 0.75
    assert acc["structural"] == 0.5  # 2 of 4
    assert acc["lexical"] == 0.25  # 1 of 4; the primitive line is in no aggregate


def test_accuracy_by_type_passivization_and_empty_groups():
    acc = accuracy_by_type([Record("decl", True), Record("passiv", False),
                            Record("obj_pp_to_subj_pp", False)])
    assert acc["in_distribution"] == 0.5 and acc["structural"] == 0.0
    assert acc["lexical"] is None
    empty = accuracy_by_type([])
    assert empty["overall"] is None and empty["n"] == 0 and empty["by_type"] == {}


def test_mean_ci95_by_hand():
    # values 1, 2, 3: mean 2, s = 1, half-width = 4.302653 / sqrt(3) = 2.484137.
    mean, half = mean_ci95([1, 2, 3])
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3))
    assert half == pytest.approx(2.484137, abs=1e-6)
    # 0.5, 0.7 (n=2): s = 0.141421, half = 12.706205 * 0.141421 / sqrt(2) = 1.2706205.
    assert mean_ci95([0.5, 0.7])[1] == pytest.approx(1.2706205)
    assert mean_ci95([0.4] * 5) == (pytest.approx(0.4), 0.0)
    # 36 values, df 35: t_{0.975}(35) = 2.030108 (tables); alternating 0 and 1: s = sqrt(36/140)
    half = mean_ci95([0.0, 1.0] * 18)[1]
    assert half == pytest.approx(2.030108 * math.sqrt(36 / 140) / 6, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        mean_ci95([0.5])
