"""Training on the streaming pipeline: a run killed with SIGKILL resumes to exactly the losses
of an uninterrupted one, in one process and in two jax.distributed processes (which must see
the same global batches as one process with two devices).

A tiny tiny-L2 model on an 8-shard gzipped-JSONL corpus from the embedded grammar, one loader
worker process per trainer process.
"""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from _train_helpers import (base_args, committed_steps, free_port, kill, run_train, snapshot,
                            start_train, step_losses, wait_for_step)
from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus.tokenizer import train_tokenizer

STEPS = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("c4")
    texts = grammar.corpus_texts(400, seed=5)
    for i in range(8):
        with gzip.open(root / f"c4-train.{i:05d}-of-00008.json.gz", "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[i::8])
    (root / "valid.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in grammar.corpus_texts(40, seed=6)))
    tok = root / "tok.model"
    train_tokenizer(texts, 512).save(tok)
    return root, str(tok)


def _args(run, corpus, **fields):
    root, tok = corpus
    return base_args(run, tok, STEPS, **{
        "data.streaming": "true", "data.corpus": f"{root}/c4-train.*-of-00008.json.gz",
        "data.valid": root / "valid.jsonl", "data.streams": 4, "data.workers": 1,
        "mesh.data": 2, "run.eval_every": 12, **fields})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus, jit_cache):
    """One process, two devices, uninterrupted."""
    run = tmp_path_factory.mktemp("straight")
    res = run_train(_args(run, corpus, **{"run.save_every": STEPS}), devices=2, cache_dir=jit_cache)
    assert res.returncode == 0, res.stderr[-3000:]
    return step_losses(run)


@pytest.fixture(scope="module")
def jit_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jit_cache")


def _killed_then_resumed(run, procs_args, devices, jit_cache):
    """Start the processes, SIGKILL them all once step STEPS // 2 is logged, start them again
    with the same command; returns the checkpointed steps at the kill."""
    procs = [start_train(a, devices=devices, cache_dir=jit_cache) for a in procs_args]
    try:
        wait_for_step(procs[0], run, STEPS // 2)
    finally:
        for p in procs:
            kill(p)
    assert procs[0].returncode == -9, "the run finished before it could be killed"
    before = committed_steps(run)
    assert before and max(before) < STEPS, before
    procs = [start_train(a, devices=devices, cache_dir=jit_cache) for a in procs_args]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return before


@pytest.mark.slow
def test_streaming_resume_after_sigkill_is_bit_identical(tmp_path, corpus, jit_cache, reference):
    _killed_then_resumed(tmp_path, [_args(tmp_path, corpus, **{"run.save_every": 1})], 2,
                         jit_cache)
    got = step_losses(tmp_path)
    assert sorted(got) == sorted(reference) == list(range(1, STEPS + 1))
    for s, losses in got.items():  # a step logged before the kill and again after: both exact
        assert losses == reference[s] * len(losses), (s, losses, reference[s])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_streaming_processes_resume_to_the_one_process_batches(tmp_path, corpus, jit_cache,
                                                                   reference):
    port = free_port()
    args = [_args(tmp_path, corpus, **{
        "run.save_every": 1, "mesh.coordinator": f"127.0.0.1:{port}",
        "mesh.num_processes": 2, "mesh.process_id": i}) for i in range(2)]
    _killed_then_resumed(tmp_path, args, 1, jit_cache)
    got = step_losses(tmp_path)
    assert sorted(got) == list(range(1, STEPS + 1))
    for s, losses in got.items():
        # each process reads only its own streams' files; together they train on the global
        # batches of one process (reductions over two processes round differently: 1e-5)
        np.testing.assert_allclose(losses, reference[s] * len(losses), rtol=0, atol=1e-5)

    # Resumed by one process: the streams' cursors are each process's own, and another
    # number of processes would read other streams. Refused in one line, checkpoints kept.
    kept = snapshot(tmp_path / "checkpoints")
    res = run_train(_args(tmp_path, corpus, **{"run.steps": STEPS + 2}), devices=2,
                    cache_dir=jit_cache)
    assert res.returncode == 2, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert f"checkpoint {STEPS} was written by 2 processes" in line, line
    assert "resume it with 2 processes" in line
    assert snapshot(tmp_path / "checkpoints") == kept
