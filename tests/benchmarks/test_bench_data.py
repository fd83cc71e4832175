"""benchmarks/bench_data.py --quick: the corpus it writes, the JSON, and that its ratios, token
counts and packing figures are computed from its own measurements (times are not asserted)."""
import gzip
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_data  # noqa: E402


def test_quick_json_written_and_consistent(tmp_path):
    out, root = tmp_path / "d.json", tmp_path / "corpus"
    res = bench_data.main(["--quick", "--corpus", str(root), "--out", str(out)])
    disk = json.loads(out.read_text())
    assert disk == json.loads(json.dumps(res))
    assert disk["benchmark"] == "bench_data" and disk["quick"] is True
    for key in ("jax", "platform", "cpu_count", "malloc_tuned", "total_s"):
        assert key in disk, key

    # the corpus: C4-format shards (gzipped JSONL url/text/timestamp), as many as asked
    q, corpus = bench_data.QUICK, disk["corpus"]
    assert corpus["shards_large"] == q["shards"] and corpus["shards_small"] == q["shards_small"]
    shards = sorted((root / "train").iterdir())
    assert [p.name for p in shards] == [f"c4-train.{i:05d}-of-{q['shards']:05d}.json.gz"
                                        for i in range(q["shards"])]
    docs = 0
    for p in shards:
        with gzip.open(p, "rt") as f:
            records = [json.loads(line) for line in f]
        assert all(sorted(r) == ["text", "timestamp", "url"] and r["text"] for r in records)
        docs += len(records)
    assert docs == corpus["corpus_docs"]
    assert corpus["shard_bytes_mean"] == pytest.approx(
        statistics.fmean(p.stat().st_size for p in shards))
    assert corpus["corpus_bytes"] == sum(p.stat().st_size for p in shards)
    assert (root / "valid" / "c4-validation.00000-of-00001.json.gz").is_file()
    assert corpus["doc_words_p10"] <= corpus["doc_words_median"] <= corpus["doc_words_p90"]

    # train.py runs: medians of the runs, ratios of the medians, memory summed over the tree
    train = disk["train"]
    for size in ("small", "large"):
        runs = train["runs"][size]
        assert len(runs) == q["repeats"]
        for r in runs:
            assert 0 < r["metrics_file_s"] <= r["first_step_s"] <= r["last_step_s"] <= r["wall_s"]
            assert r["rss_last_step"] == sum(r["rss_each_last_step"]) > 0
            assert r["processes_last_step"] == len(r["rss_each_last_step"]) >= 1 + q["workers"]
            assert r["peak_rss"] >= r["rss_last_step"]
            assert 0 < r["uss_last_step"] <= r["pss_last_step"] <= r["rss_last_step"]
        assert disk["first_step_s"][size] == statistics.median(r["first_step_s"] for r in runs)
        assert disk["rss_last_step_bytes"][size] == statistics.median(
            r["rss_last_step"] for r in runs)
    ratios = disk["ratios"]
    for ratio, measure in (("first_step_large_over_small", "first_step_s"),
                           ("rss_large_over_small", "rss_last_step_bytes"),
                           ("pss_large_over_small", "pss_last_step_bytes"),
                           ("peak_rss_large_over_small", "peak_rss_bytes")):
        assert ratios[ratio] == pytest.approx(disk[measure]["large"] / disk[measure]["small"])

    # the pipeline: tokens counted, rate, packing (training windows are always full)
    pipe = disk["pipeline"]
    assert pipe["tokens"] == q["pipe_batches"] * q["pipe_batch"] * q["pipe_seq_len"]
    assert pipe["windows"] == q["pipe_batches"] * q["pipe_batch"]
    assert pipe["tokens_per_s"] == pytest.approx(pipe["tokens"] / pipe["seconds"])
    assert pipe["packing_efficiency"] == pytest.approx(pipe["weight_sum"] / pipe["tokens"])
    assert 0.99 < pipe["packing_efficiency"] <= 1.0
    assert pipe["segments_per_window"] == pytest.approx(pipe["segments"] / pipe["windows"])
    assert pipe["segments_per_window"] >= 1

    # the train step it is compared with
    step = disk["step"]
    assert (step["family"], step["n_layers"]) == (q["step_family"], q["step_layers"])
    assert len(step["step_s_all"]) == q["step_steps"]
    assert step["tokens_per_s"] == pytest.approx(
        q["step_batch"] * q["step_seq_len"] / step["step_s_median"])
    assert ratios["pipeline_over_step"] == pytest.approx(
        pipe["tokens_per_s"] / step["tokens_per_s"])

    # targets and verdicts agree with the numbers
    t, met = disk["targets"], disk["met"]
    assert t == bench_data.TARGETS
    assert met == {
        "first_step": ratios["first_step_large_over_small"] <= t["first_step_ratio_max"],
        "memory": ratios["rss_large_over_small"] <= t["memory_ratio_max"],
        "pipeline_throughput": ratios["pipeline_over_step"] >= t["pipeline_over_step_min"],
        "packing": pipe["packing_efficiency"] >= t["packing_efficiency_min"]}

    # a second run with the same settings reuses the kept corpus
    again = bench_data.make_corpus(root, bench_data.parse(["--quick", "--corpus", str(root)]))
    assert again["reused"] and again["corpus_docs"] == corpus["corpus_docs"]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").is_file(), reason="needs Linux /proc")
def test_tree_memory_from_proc_matches_psutil():
    """The /proc fallback (no psutil) finds the same process tree and about the same memory."""
    pytest.importorskip("psutil")

    child = subprocess.Popen(["sleep", "30"])
    try:
        proc = bench_data.tree_memory(os.getpid(), full=True, use_psutil=False)
        ps = bench_data.tree_memory(os.getpid(), full=True, use_psutil=True)
    finally:
        child.kill()
        child.wait()
    assert proc["processes"] == ps["processes"] == len(proc["rss_each"]) >= 2
    assert proc["rss"] == sum(proc["rss_each"])
    assert 0 < proc["uss"] <= proc["pss"] <= proc["rss"]
    for key in ("rss", "pss", "uss"):  # two readings a moment apart
        assert proc[key] == pytest.approx(ps[key], rel=0.05), key
