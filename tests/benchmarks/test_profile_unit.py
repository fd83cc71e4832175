"""profile_unit.py: a unit's wall time split into phases that account for all of it."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import profile_unit  # noqa: E402


@pytest.mark.slow
def test_phases_account_for_the_wall_time_of_both_units(tmp_path):
    out = tmp_path / "p.json"
    profile_unit.main(["--steps", "3", "--depth", "1", "--out", str(out)])
    units = json.loads(out.read_text())["units"]
    assert [u["unit"] for u in units] == ["pretrain L1", "fine-tune L1 on semantic_parsing"]
    for u in units:
        s = u["seconds"]
        assert set(s) == set(profile_unit.PHASES)
        # steps are the loop's time less what the loop spends elsewhere, and the rest is the
        # wall time less every phase: neither is negative unless a phase is counted twice
        assert min(s.values()) >= 0, s
        # every unit prepares data, compiles its step and evaluates
        assert s["data"] > 0 and s["first_step"] > 0 and s["evaluation"] > 0
        assert u["steps"] == 3 and 0 < u["step_share_of_peak"] < 1
