"""benchmarks/bench_grammar.py on small sizes: the JSON it writes and that its rates and target
check are computed from its own times (the times themselves are not asserted)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_grammar  # noqa: E402


def test_json_written_and_consistent(tmp_path):
    out = tmp_path / "g.json"
    res = bench_grammar.main(["--sentences", "200", "--docs", "20", "--repeats", "2",
                              "--out", str(out)])
    disk = json.loads(out.read_text())
    assert disk == json.loads(json.dumps(res))
    assert disk["benchmark"] == "bench_grammar" and disk["sentences"] == 200
    for key in ("jax", "platform", "cpu_count", "malloc_tuned"):
        assert key in disk, key
    assert len(disk["generate_s_all"]) == 2 and all(t > 0 for t in disk["generate_s_all"])
    assert disk["sentences_per_s"] == pytest.approx(200 / disk["generate_s"])
    assert disk["docs_per_s"] == pytest.approx(20 / disk["corpus_texts_s"])
    assert disk["target_s"] == pytest.approx(2.0 * 200 / 20_000)
    assert disk["within_target"] == (disk["generate_s"] <= disk["target_s"])
