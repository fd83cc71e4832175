"""Training integration tests: sharding equivalence, bit-exact resume after SIGKILL, gradient
accumulation, two jax.distributed processes, bad input, and the run summary.

Every run is a tiny tiny-L2 model on the embedded grammar corpus, sharing one tokenizer.
Subprocess runs share a persistent compilation cache, so identical programs compile once.
"""
from __future__ import annotations

import importlib.util
import json
import math
import shutil

import jax
import numpy as np
import pytest

from _train_helpers import (GRAMMAR_DOCS, REPO, base_args, committed_steps, free_port, kill,
                            leaves, load_state, read_metrics, run_train, saved_partition_specs,
                            snapshot, start_train, step_losses, wait_for_step)
from jaxdepth.config.cli import parse_args
from jaxdepth.config import Config, ConfigError
from jaxdepth.models.depth_family import depth_family_dff
from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus.tokenizer import train_tokenizer
from jaxdepth.tasks import task_for
from jaxdepth.optim import make_optimizer
from jaxdepth.trainer.sharding import make_mesh
from jaxdepth.trainer.state import state_shardings

VOCAB = 512  # tiny-L2's vocabulary


def _spec_axes(sharding) -> set:
    out = set()
    for entry in sharding.spec:
        out.update(entry if isinstance(entry, tuple) else (entry,))
    return out - {None}


def _losses(run_dir, steps: int) -> np.ndarray:
    """The loss of every step 1..steps (each step logged exactly once)."""
    logged = step_losses(run_dir)
    assert sorted(logged) == list(range(1, steps + 1)), f"steps logged: {sorted(logged)}"
    assert all(len(v) == 1 for v in logged.values())
    return np.array([logged[s][0] for s in range(1, steps + 1)])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """One SentencePiece model for every run, trained like prepare_lm_data would."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    train_tokenizer(grammar.corpus_texts(GRAMMAR_DOCS, seed=1234), VOCAB).save(path)
    return str(path)


@pytest.fixture(scope="module")
def jit_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("jit_cache")


# ----------------------------------------------------------------------------- 1. sharding

SHARD_STEPS = 6


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory, tokenizer):
    """In-process train(cfg) on a 1 x 1 mesh: (run dir, per-step losses, final state)."""
    from jaxdepth.tasks import train
    run = tmp_path_factory.mktemp("single")
    cfg = parse_args(base_args(run, tokenizer, SHARD_STEPS,
                               **{"mesh.data": 1, "mesh.model": 1}))
    summary = train(cfg)
    assert summary["done"] and summary["devices"] == 1
    return run, _losses(run, SHARD_STEPS), load_state(run)[1]


@pytest.mark.fake_devices
@pytest.mark.parametrize("fsdp", [False, True], ids=["dp4xtp2", "fsdp4xtp2"])
def test_sharded_equals_single_device(tmp_path, tokenizer, single_device_run, fsdp):
    from jaxdepth.tasks import train
    assert jax.device_count() == 8
    cfg = parse_args(base_args(tmp_path, tokenizer, SHARD_STEPS,
                               **{"mesh.data": 4, "mesh.model": 2, "mesh.fsdp": fsdp}))

    # The layout train() uses really splits parameters (and Adam moments) over "model"
    # (tensor parallel) and, with FSDP, over "data".
    mesh = make_mesh(cfg.mesh)
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    _, sh = state_shardings([cfg], make_optimizer(cfg.optim, cfg.run.steps), mesh,
                            task_for(cfg))
    p_axes = [_spec_axes(s) for s in jax.tree.leaves(sh.model)]
    assert any("model" in a for a in p_axes)
    assert any("data" in a for a in p_axes) == fsdp
    assert any("model" in _spec_axes(s) for s in jax.tree.leaves(sh.opt_state))
    # after the trial axis (one trial: not sharded): vocab 512 over the 2-way model axis
    assert sh.model.embed.spec[:2] == (None, "model")
    assert sh.model.blocks.mlp.wi_0.spec[-1] == "model"  # d_ff 256

    summary = train(cfg)
    assert summary["done"] and summary["devices"] == 8
    # ... and the arrays the run saved were laid out that way
    specs = saved_partition_specs(tmp_path, SHARD_STEPS)
    assert specs["model.embed"][0] == "model"
    assert specs["model.blocks.mlp.wi_0"][-1] == "model"
    assert any("data" in str(v) for v in specs.values()) == fsdp

    _, ref_losses, ref_state = single_device_run
    np.testing.assert_allclose(_losses(tmp_path, SHARD_STEPS), ref_losses, rtol=0, atol=1e-5)
    got = leaves(load_state(tmp_path)[1])
    want = leaves(ref_state)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def test_gradient_accumulation_matches(tmp_path, tokenizer, single_device_run):
    """accum_steps 2 splits each batch of 8 into two micro-batches of 4: same losses."""
    from jaxdepth.tasks import train
    cfg = parse_args(base_args(tmp_path, tokenizer, SHARD_STEPS,
                               **{"mesh.data": 1, "mesh.model": 1, "optim.accum_steps": 2}))
    train(cfg)
    _, ref_losses, ref_state = single_device_run
    np.testing.assert_allclose(_losses(tmp_path, SHARD_STEPS), ref_losses, rtol=1e-6, atol=0)
    for g, w in zip(leaves(load_state(tmp_path)[1]), leaves(ref_state)):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- 2. resume

RESUME_STEPS = 20


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tokenizer, jit_cache):
    """RESUME_STEPS steps in one go (subprocess), with greedy samples and a checkpoint every 5."""
    run = tmp_path_factory.mktemp("straight")
    res = run_train(base_args(run, tokenizer, RESUME_STEPS,
                              **{"run.save_every": 5, "run.samples": 2, "run.sample_tokens": 4,
                                 "run.eval_every": 10}),
                    cache_dir=jit_cache)
    assert res.returncode == 0, res.stderr[-3000:]
    return run


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical(tmp_path, tokenizer, jit_cache, straight_run):
    args = base_args(tmp_path, tokenizer, RESUME_STEPS,
                     **{"run.save_every": 1, "run.eval_every": 10})
    proc = start_train(args, cache_dir=jit_cache)
    try:
        seen = wait_for_step(proc, tmp_path, RESUME_STEPS // 2)
    finally:
        kill(proc)
    assert proc.returncode == -9, "the run finished before it could be killed"
    before = committed_steps(tmp_path)
    logged_before = set(step_losses(tmp_path))
    assert seen < RESUME_STEPS and before and max(before) < RESUME_STEPS, (seen, before)
    assert not (tmp_path / "summary.json").exists()

    res = run_train(args, cache_dir=jit_cache)  # the same command resumes
    assert res.returncode == 0, res.stderr[-3000:]

    want = step_losses(straight_run)
    got = step_losses(tmp_path)
    assert sorted(got) == sorted(want) == list(range(1, RESUME_STEPS + 1))
    # Steps logged before the kill and again after the restart agree exactly, with each other
    # and with the uninterrupted run.
    # The restart began right after the latest checkpoint committed before the kill: exactly
    # the steps logged after it were redone.
    redone = {s for s, v in got.items() if len(v) > 1}
    assert redone == {s for s in logged_before if s > max(before)}
    assert all(len(v) <= 2 for v in got.values())
    for s in want:
        assert got[s] == want[s] * len(got[s]), (s, got[s], want[s])

    step_a, a = load_state(straight_run)
    step_b, b = load_state(tmp_path)
    assert step_a == step_b == RESUME_STEPS
    assert int(a.step) == RESUME_STEPS
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    # validation losses (step 10 before the kill or after the restart, and the final one) agree
    va = {r["step"]: r["valid_loss"] for r in read_metrics(straight_run) if "valid_loss" in r}
    vb = {r["step"]: r["valid_loss"] for r in read_metrics(tmp_path) if "valid_loss" in r}
    assert va == vb and sorted(va) == [10, 20]


# ----------------------------------------------------------------------------- 3. processes

MP_STEPS = 4


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_match_two_devices(tmp_path, tokenizer, jit_cache):
    mp_dir, ref_dir = tmp_path / "two_procs", tmp_path / "one_proc"
    common = {"mesh.data": 2, "run.save_every": 2, "run.eval_every": 2}
    port = free_port()
    procs = [start_train(base_args(mp_dir, tokenizer, MP_STEPS, **common,
                                   **{"mesh.coordinator": f"127.0.0.1:{port}",
                                      "mesh.num_processes": 2, "mesh.process_id": i}),
                         devices=1)
             for i in range(2)]
    try:
        ref = run_train(base_args(ref_dir, tokenizer, MP_STEPS, **common), devices=2,
                        cache_dir=jit_cache)
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            kill(p)
    assert ref.returncode == 0, ref.stderr[-3000:]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    np.testing.assert_allclose(_losses(mp_dir, MP_STEPS), _losses(ref_dir, MP_STEPS),
                               rtol=0, atol=1e-5)
    v_mp = [r["valid_loss"] for r in read_metrics(mp_dir) if "valid_loss" in r]
    v_ref = [r["valid_loss"] for r in read_metrics(ref_dir) if "valid_loss" in r]
    assert len(v_mp) == len(v_ref) == 2
    np.testing.assert_allclose(v_mp, v_ref, rtol=0, atol=1e-5)
    assert json.loads((mp_dir / "summary.json").read_text())["devices"] == 2
    # the checkpoint written jointly by both processes holds the same state
    assert committed_steps(mp_dir) == [2, 4]
    for x, y in zip(leaves(load_state(mp_dir)[1]), leaves(load_state(ref_dir)[1])):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- 4. bad input

def _fails(main, argv, capsys, code: int, *needles: str) -> str:
    assert main([str(a) for a in argv]) == code
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"
    return err


def test_missing_corpus_exits_nonzero_naming_file(tmp_path, tokenizer):
    res = run_train(base_args(tmp_path / "run", tokenizer, 2,
                              **{"data.corpus": tmp_path / "nonexistent.txt"}))
    assert res.returncode != 0
    assert str(tmp_path / "nonexistent.txt") in res.stderr
    assert "Traceback" not in res.stderr


def test_empty_corpus(tmp_path, tokenizer, train_main, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    _fails(train_main, base_args(tmp_path / "run", tokenizer, 2, **{"data.corpus": empty}),
           capsys, 2, "empty corpus", str(empty))


def test_malformed_jsonl_names_file_and_line(tmp_path, tokenizer, train_main, capsys):
    bad = tmp_path / "c4.jsonl"
    bad.write_text('{"text": "a fine document"}\n\n{"text": "broken\n{"text": "more"}\n')
    _fails(train_main, base_args(tmp_path / "run", tokenizer, 2, **{"data.corpus": bad}),
           capsys, 2, f"{bad}:3", "malformed JSON")


@pytest.mark.parametrize("override, field", [
    ({"model.n_heads": 3}, "model.n_heads"),
    ({"model.d_ff": 0}, "model.d_ff"),
    ({"optim.accum_steps": 3}, "optim.accum_steps"),
    ({"model.n_layer": 3}, "model.n_layer"),
])
def test_impossible_config_names_field(tmp_path, tokenizer, train_main, capsys, override, field):
    _fails(train_main, base_args(tmp_path, tokenizer, 2, **override), capsys, 2,
           "config error", field)
    assert not (tmp_path / "checkpoints").exists()


def test_unknown_preset_and_too_deep_family(train_main, capsys):
    _fails(train_main, ["--preset", "small-L16"], capsys, 2, "preset", "small-L16")
    with pytest.raises(ConfigError, match=r"^model\.d_ff: .*n_layers=40"):
        depth_family_dff(64, 2, 256, 40)


def _finished_copy(straight_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight_run, run)  # copy2 keeps mtimes; the fixture stays untouched
    return run


@pytest.mark.slow
@pytest.mark.parametrize("override, field", [
    ({"model.vocab_size": 256}, "model.vocab_size"),
    ({"model.d_model": 128}, "model.d_model"),
    ({"optim.lr": 0.0123}, "optim.lr"),
])
def test_incompatible_resume_keeps_checkpoints(tmp_path, tokenizer, jit_cache, straight_run,
                                               override, field):
    run = _finished_copy(straight_run, tmp_path)
    steps = committed_steps(run)
    assert steps == [10, 15, 20]
    ckpts, cfg_json = snapshot(run / "checkpoints"), (run / "config.json").read_bytes()
    res = run_train(base_args(run, tokenizer, 2 * RESUME_STEPS, **override), cache_dir=jit_cache)
    assert res.returncode == 2
    assert field in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert committed_steps(run) == steps
    assert snapshot(run / "checkpoints") == ckpts
    assert (run / "config.json").read_bytes() == cfg_json


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tokenizer, jit_cache):
    # lr is 0 for step 1 (warmup), then 1e30: step 2's update blows the parameters up.
    args = base_args(tmp_path, tokenizer, 6, **{
        "run.save_every": 1, "optim.lr": 1e30, "optim.clip_norm": 0, "optim.warmup_steps": 1,
        "optim.schedule": "constant"})
    res = run_train(args, cache_dir=jit_cache)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "non-finite" in res.stderr and "Traceback" not in res.stderr
    assert committed_steps(tmp_path) == [1]
    step, state = load_state(tmp_path)
    assert step == 1 and int(state.step) == 1
    for x in leaves(state.model):
        assert np.all(np.isfinite(x)) and np.max(np.abs(x)) < 10.0
    assert not (tmp_path / "summary.json").exists()
    # the message points at the good checkpoint
    assert "step 1" in res.stderr


# ----------------------------------------------------------------------------- 5. summary

@pytest.mark.slow
def test_summary_and_saved_config(straight_run, tokenizer):
    s = json.loads((straight_run / "summary.json").read_text())
    assert s["done"] and s["step"] == RESUME_STEPS
    for k in ("valid_ppl", "valid_loss", "train_loss", "tokens_per_s", "mfu"):
        assert isinstance(s[k], float) and math.isfinite(s[k]) and s[k] > 0, k
    assert s["valid_ppl"] == pytest.approx(math.exp(s["valid_loss"]), rel=1e-12)
    # the final training loss is the last logged one; throughput is the run average, and MFU
    # is that throughput against the stated peak
    logged = step_losses(straight_run)
    assert s["train_loss"] == logged[RESUME_STEPS][0]
    assert s["mfu"] == pytest.approx(
        s["tokens_per_s"] * s["flops_per_token"] / (s["peak_flops"] * s["devices"]), rel=1e-9)
    rates = [r["tokens_per_s"] for r in read_metrics(straight_run) if "tokens_per_s" in r]
    assert len(rates) == RESUME_STEPS - 1  # every step but the first (compilation) is timed
    assert min(rates) <= s["tokens_per_s"] <= max(rates)
    assert 0 < s["mfu"] < 1
    assert len(s["samples"]) == 2
    for smp in s["samples"]:
        assert smp["prompt"] and isinstance(smp["continuation"], str)

    saved = json.loads((straight_run / "config.json").read_text())
    cfg = Config.from_dict(saved)
    assert cfg.to_dict() == saved
    expected = parse_args(base_args(straight_run, tokenizer, RESUME_STEPS,
                                    **{"run.save_every": 5, "run.samples": 2,
                                       "run.sample_tokens": 4, "run.eval_every": 10}))
    assert cfg == expected
    # the config stored in each checkpoint is the same resolved config
    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(straight_run.absolute() / "checkpoints")
    try:
        for step in mngr.all_steps():
            got = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config
            assert Config.from_dict(got) == cfg
    finally:
        mngr.close()


def test_eval_py_matches_training_and_scores_a_text_file(straight_run, tmp_path):
    """eval.py on the final checkpoint reproduces the run's own validation perplexity, and on a
    text file equals a perplexity recomputed here from the restored model, token by token."""
    import jax.numpy as jnp

    from jaxdepth.config import MeshConfig
    from jaxdepth.data.corpus.tokenizer import Tokenizer
    from jaxdepth.trainer import checkpoint as ckpt, restore as rs

    spec = importlib.util.spec_from_file_location("eval_py", REPO / "eval.py")
    eval_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_py)
    s = json.loads((straight_run / "summary.json").read_text())
    out = eval_py.evaluate(straight_run)
    assert out["step"] == RESUME_STEPS
    # what it prints is also written, by default next to the checkpoints
    assert json.loads((straight_run / f"eval_step{RESUME_STEPS}.json").read_text()) == out
    assert out["loss"] == pytest.approx(s["valid_loss"], rel=1e-6)
    assert out["tokens"] == s["valid_tokens"]

    text = tmp_path / "held_out.txt"
    text.write_text("the cat saw a dog .\n\nsome birds slept .\n")
    got = eval_py.evaluate(straight_run, data=str(text), batch=2, out=str(tmp_path / "ppl.json"))
    assert json.loads((tmp_path / "ppl.json").read_text()) == got
    cfg = Config.from_dict(json.loads((straight_run / "config.json").read_text()))
    mngr = ckpt.open_manager(straight_run, read_only=True)
    mesh = make_mesh(MeshConfig(data=1))
    state = rs.restore_state(mngr, RESUME_STEPS, *state_shardings(
        [cfg], make_optimizer(cfg.optim, cfg.run.steps), mesh, task_for(cfg)))
    mngr.close()
    model = state.models().one(0)
    tok = Tokenizer.load(straight_run / "data" / "tokenizer.model")
    stream = []
    for doc in ("the cat saw a dog .", "some birds slept ."):
        stream += tok.encode(doc) + [1]
    logits = np.asarray(model(jnp.asarray([stream[:-1]], jnp.int32)))[0].astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    nll = -logp[np.arange(len(stream) - 1), stream[1:]].mean()
    assert got["tokens"] == len(stream) - 1
    assert got["loss"] == pytest.approx(nll, rel=1e-5)

    with pytest.raises(ValueError, match="--step 3"):
        eval_py.evaluate(straight_run, step=3)
    # a flag a language-model run's evaluation does not read is refused, not ignored
    with pytest.raises(ConfigError, match=r"^--splits: a lm run's evaluation does not read it "
                                          r"\(it reads: --step, --data, --batch, --out\)"):
        eval_py.evaluate(straight_run, splits="gen")


@pytest.mark.fake_devices
def test_adafactor_sharded_equals_single_device(tmp_path, tokenizer):
    """Adafactor (t5x recipe: rsqrt schedule, factored second moments whose row/column
    statistics do not have their parameter's shape) on an FSDP x TP mesh = one device.

    d_model 128 / d_ff 256 so the embedding, head and MLP matrices reach Adafactor's factoring
    threshold (both dims >= 128); the statistics sharded here are then the factored ones.
    """
    from jaxdepth.tasks import train
    recipe = {"optim.name": "adafactor", "optim.schedule": "rsqrt", "optim.lr": 1.0,
              "optim.warmup_steps": 100, "optim.clip_norm": 0, "optim.weight_decay": 0,
              "model.d_model": 128, "model.d_ff": 256}
    runs = {}
    for name, mesh in (("one", {"mesh.data": 1, "mesh.model": 1}),
                       ("fsdp_tp", {"mesh.data": 4, "mesh.model": 2, "mesh.fsdp": True})):
        run = tmp_path / name
        train(parse_args(base_args(run, tokenizer, 4, **recipe, **mesh)))
        runs[name] = (_losses(run, 4), leaves(load_state(run)[1]))
    losses_one, state_one = runs["one"]
    losses_tp, state_tp = runs["fsdp_tp"]
    factored = [x for x in state_one if x.ndim == 1 and x.shape[0] in (256, 512)]
    assert factored, "expected factored row/column statistics in the optimizer state"
    assert losses_one[-1] < losses_one[0]  # it trains
    np.testing.assert_allclose(losses_tp, losses_one, rtol=0, atol=1e-5)
    for g, w in zip(state_tp, state_one):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
