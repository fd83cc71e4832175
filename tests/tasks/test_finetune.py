"""Prefix-LM fine-tuning through the trainer: decoding prompts agree with the training features,
a tiny model memorises a tiny task to 100% exact match, pretrained weights are loaded, every
evaluation point is recorded, predictions are scored as written, and real COGS runs end to end.
"""
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import Config, ConfigError, apply_overrides
from jaxdepth.config.presets import from_preset
from jaxdepth.data.embedded.grammar import corpus_texts
from jaxdepth.data.finetune.prefix_lm_features import prefix_lm_features
from jaxdepth.data.finetune.seq2seq_readers import Example
from jaxdepth.data.corpus.tokenizer import EOS_ID, train_tokenizer
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.tasks.decoding import Geometry, predict, prompts
from jaxdepth.models.trial_axis import Models

TINY = {"vocab_size": 96, "d_model": 32, "n_layers": 2, "d_ff": 64, "n_heads": 2}


def _cfg(run_dir, **sections) -> Config:
    base = {"model": TINY, "data": {"batch_size": 8, "seq_len": 128},
            "optim": {"lr": 3e-3, "schedule": "constant", "warmup_steps": 0, "weight_decay": 0.0},
            "run": {"dir": str(run_dir), "steps": 20, "eval_every": 10, "save_every": 10,
                    "log_every": 5, "progress": False, "samples": 0},
            "task": {"name": "passivization", "n_train": 8, "n_eval": 4}}
    for sec, vals in sections.items():
        base[sec] = {**base.get(sec, {}), **vals}
    return Config.from_dict(base)


def naive_argmax(model, prompt: list[int], max_new: int, width: int = 48) -> list[int]:
    """Greedy decoding by re-running the whole sequence each step, no cache. The sequence is
    right-padded to a fixed width (one compile): causal attention keeps the padding out of
    the logits read at the last real position."""
    forward = eqx.filter_jit(lambda m, x: m(x))
    seq = list(prompt)
    out = []
    for _ in range(max_new):
        padded = np.zeros((1, width), np.int32)
        padded[0, :len(seq)] = seq
        logits = forward(model, jnp.asarray(padded))
        tok = int(jnp.argmax(logits[0, len(seq) - 1]))
        out.append(tok)
        if tok == EOS_ID:
            break
        seq.append(tok)
    return out


def test_prompts_are_the_training_inputs_up_to_the_source_eos():
    tok = train_tokenizer(corpus_texts(100, seed=0), 96)
    ex = [Example("the cat saw a dog . passiv", "a dog was seen by the cat .", "passiv"),
          Example("a dog saw . decl", "a dog saw .", "decl")]
    arr, lengths = prompts(ex, tok, width=32)
    for row, n, e in zip(arr, lengths, ex):
        f = prefix_lm_features(tok.encode(e.source), tok.encode(e.target), 64)
        np.testing.assert_array_equal(row[:n], f["inputs"][:f["prefix_len"] + 1])
        assert np.all(row[n:] == 0)


def test_batched_cached_predictions_equal_uncached_argmax(getkey):
    texts = ["the cat saw a dog .", "a dog saw the big cat .", "some cats see my dogs ."]
    tok = train_tokenizer(corpus_texts(100, seed=0), 96)
    model = DecoderLM(Config.from_dict({"model": TINY}).model, key=getkey())
    ex = [Example(t, "x", "in_distribution") for t in texts[:3]]
    geo = Geometry(batch=2, width=32, max_new=7)  # 3 examples: the last batch is padded
    got = predict(Models(model), tok, ex, geo)[0]
    for e, text in zip(ex, got):
        p = [0, *tok.encode(e.source), EOS_ID]
        ids = naive_argmax(model, p, geo.max_new)
        ids = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
        assert text == tok.decode(ids)


def test_memorises_a_tiny_task_and_records_every_evaluation(tmp_path):
    from jaxdepth.tasks import train

    run = tmp_path / "ft"
    train_tokenizer(corpus_texts(1000, seed=0), 384).save(tmp_path / "tok.model")
    cfg = _cfg(run, run={"steps": 300, "eval_every": 100, "save_every": 300},
               task={"eval_splits": "train,dev"},
               model={"vocab_size": 384, "d_model": 64, "d_ff": 128},
               data={"tokenizer": str(tmp_path / "tok.model"), "seq_len": 128})
    s = train(cfg)
    assert s["done"] and s["task"] == "passivization"
    assert s["accuracy"]["train"]["overall"] == 1.0  # 8 examples learnt by heart
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [100, 200, 300] and evals[-1]["final"]
    assert s["train_loss"] < 0.01
    # predictions are scored as written: correct == whole-sequence match, summary == mean
    for split in ("train", "dev"):
        rows = [json.loads(line) for line in (run / "predictions" / f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == {"train": 8, "dev": 4}[split]
        assert set(rows[0]) == {"input", "gold", "prediction", "correct", "type"}
        for r in rows:
            assert r["correct"] == (r["prediction"].split() == r["gold"].split())
        assert s["accuracy"][split]["overall"] == pytest.approx(np.mean([r["correct"] for r in rows]))
    summary = json.loads((run / "predictions" / "summary.json").read_text())
    assert summary["step"] == 300 and summary["accuracy"]["train"]["overall"] == 1.0


def test_starts_from_pretrained_weights_and_checks_shapes(tmp_path):
    from jaxdepth.tasks import load_model, task_for, train
    from jaxdepth.trainer import checkpoint as ckpt
    from jaxdepth.trainer.loop import restore_or_init
    from jaxdepth.optim import make_optimizer
    from jaxdepth.trainer.sharding import make_mesh

    def prepared(cfg, run_dir):
        task = task_for(cfg)
        task.prepare(run_dir, True, lambda: None)
        return task

    pre = tmp_path / "pre"
    train(Config.from_dict({"model": TINY, "data": {"batch_size": 8, "seq_len": 32, "grammar_docs": 300},
                            "run": {"dir": str(pre), "steps": 4, "save_every": 2, "eval_every": 4,
                                    "progress": False, "samples": 0}}))
    cfg = _cfg(tmp_path / "ft", task={"init_from": str(pre), "init_step": 2},
               model={"dropout": 0.1})
    mesh = make_mesh(cfg.mesh)
    task = prepared(cfg, tmp_path / "ft")
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    mngr = ckpt.open_manager(tmp_path / "ft", 1)
    from jaxdepth.data.corpus.pipeline import lm_iterator
    from jaxdepth.trainer.trials import Batches, Trials

    state, _, _ = restore_or_init(Trials([cfg], [task], mesh), tx, mngr,
                                  Batches([lm_iterator(task.dataset())]))
    want, _, _ = load_model(pre, 2)
    model = state.models().one(0)
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # this run's options, a fresh optimizer
    assert model.cfg.dropout == 0.1 and int(state.step[0]) == 0
    assert (tmp_path / "ft" / "data" / "tokenizer.model").read_bytes() == \
        (pre / "data" / "tokenizer.model").read_bytes()  # one tokenizer for both
    with pytest.raises(ConfigError, match="model.d_ff: 80 here but 64"):
        prepared(_cfg(tmp_path / "x", model={"d_ff": 80}, task={"init_from": str(pre)}),
                 tmp_path / "x").initial_model(mesh, None)
    with pytest.raises(ValueError, match="task.init_step 3: not a checkpoint"):
        prepared(_cfg(tmp_path / "y", task={"init_from": str(pre), "init_step": 3}),
                 tmp_path / "y").initial_model(mesh, None)
    with pytest.raises(FileNotFoundError, match="task.init_from"):
        prepared(_cfg(tmp_path / "z", task={"init_from": str(tmp_path / "nowhere")}),
                 tmp_path / "z")


def test_task_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="task.dir"):
        Config.from_dict({"task": {"name": "cogs"}})
    with pytest.raises(ConfigError, match="task.name"):
        Config.from_dict({"task": {"name": "scan"}})
    with pytest.raises(ConfigError, match="task.eval_splits"):
        from jaxdepth.data.finetune.finetune_data import resolve_eval_splits, task_splits
        task = Config.from_dict({"task": {"name": "passivization", "n_train": 4, "n_eval": 2,
                                          "eval_splits": "dev,gen"}}).task
        resolve_eval_splits(task, *task_splits(task))
    cfg = from_preset("tiny-L2+finetune")  # model preset, then the paper's fine-tuning recipe
    assert cfg.model.n_layers == 2 and cfg.model.dropout == 0.1
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.schedule) == ("adafactor", 1e-3, "constant")
    assert (cfg.data.batch_size, cfg.run.steps, cfg.run.eval_every) == (128, 10_000, 250)
    # the explicit +finetune preset starts a task from the same defaults; explicit fields win
    import dataclasses

    from jaxdepth.config.cli import parse_args
    ft = parse_args(["--preset", "tiny-L2+finetune", "--task.name", "passivization",
                     "--run.steps", "50"])
    assert (ft.optim.name, ft.optim.lr, ft.model.dropout, ft.run.eval_every, ft.run.steps) == \
        ("adafactor", 1e-3, 0.1, 250, 50)
    # naming a task on a pretraining config changes nothing but the optimizer fields it left
    # to the run kind's recipe (t5x fine-tuning's); no silent fine-tuning preset otherwise
    pre = parse_args(["--preset", "tiny-L2", "--run.steps", "50"])
    bare = parse_args(["--preset", "tiny-L2", "--task.name", "passivization", "--run.steps", "50"])
    assert bare.task.name == "passivization" and bare.preset == "tiny-L2"
    assert dataclasses.replace(bare, task=pre.task) == pre
    assert (bare.optim.name, bare.optim.lr, bare.optim.schedule, bare.model.dropout,
            bare.run.eval_every) == ("adafactor", 1e-3, "constant", 0.0, 100)
    assert (pre.optim.lr, pre.optim.schedule) == (6e-2, "cosine")  # the lm kind's recipe
    assert parse_args(["--preset", "tiny-L2"]).optim == pre.optim  # pretraining untouched


@pytest.mark.slow
def test_real_cogs_fine_tunes_and_scores_a_slice_of_gen(tmp_path, shared_data):
    from jaxdepth.tasks import train

    run = tmp_path / "cogs"
    cfg = apply_overrides(_cfg(run), {
        "model": {"vocab_size": 512}, "data": {"seq_len": 160},
        "task": {"name": "cogs", "dir": str(shared_data / "cogs"), "eval_splits": "gen",
                 "eval_max": 8, "truncate": True},
        "run": {"steps": 4, "eval_every": 4, "save_every": 4}})
    s = train(cfg)
    rows = [json.loads(line) for line in (run / "predictions" / "gen.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and s["train_examples"] == 24155
    from jaxdepth.data.finetune.seq2seq_readers import read_cogs
    gen = {e.source: e for e in read_cogs(shared_data / "cogs", "gen")}
    for r in rows:  # each row is a real gen line with its published type and target
        assert gen[r["input"]].target == r["gold"] and gen[r["input"]].type == r["type"]
        assert r["correct"] == (r["prediction"].split() == r["gold"].split())
    assert s["gen_accuracy"] == pytest.approx(np.mean([r["correct"] for r in rows]))
    assert set(s["by_type"]) == {r["type"] for r in rows}
    # COGS has capitals the tokenizer trained on its own train text knows: nothing unknown
    assert s["unk"]["target_unk_tokens"] == 0


@pytest.mark.slow
def test_cogs_cpu_preset_data_on_real_cogs(tmp_path, shared_data):
    """The pieces of the cogs-cpu recipe on the real data, without training: a BPE tokenizer
    of the preset's size trained on the train split covers every split, and packing puts
    several examples in each row with little padding."""
    from jaxdepth.config.cli import parse_args
    from jaxdepth.data.finetune.finetune_data import prepare_task_data

    cfg = parse_args(["--preset", "cogs-cpu", "--task.name", "cogs",
                      "--task.dir", str(shared_data / "cogs"), "--run.dir", str(tmp_path)])
    d = prepare_task_data(cfg.task, cfg.data.tokenizer, cfg.vocab_size, cfg.data.seq_len,
                          tmp_path, True, tokenizer_type=cfg.data.tokenizer_type)
    assert d.tokenizer.vocab_size == cfg.model.vocab_size == 768
    assert d.unk.examples_with_unk == 0
    n = len(d.splits["train"])
    pieces = int((d.train["segment_ids"] > 0).sum())  # source + target + 2 EOS, every example
    assert n == 24155 and pieces / n < 60  # unigram at this size: about 88
    assert len(d.train["inputs"]) < n / 4  # more than four examples per 256-token row
    assert pieces / d.train["inputs"].size > 0.95
    np.testing.assert_array_equal(np.unique(d.train["segment_ids"][:, 0]), [1])


def test_prepare_returns_the_data_as_one_frozen_value(tmp_path):
    """prepare returns the kind's data (PrefixLMPrepared, frozen) and keeps it as
    task.prepared; besides it, it records only where the outputs and the data go (the data
    directory keeps the pretrained step a run started from). read_data builds an
    equal value and sets nothing (eval.py's way to read a run's data)."""
    import dataclasses

    from jaxdepth.tasks import task_for
    from jaxdepth.tasks.prefix_lm import PrefixLMPrepared

    tok = tmp_path / "tok.model"
    train_tokenizer(corpus_texts(100, seed=0), 96).save(tok)
    cfg = _cfg(tmp_path / "run", data={"tokenizer": str(tok)})
    task = task_for(cfg)
    before = set(vars(task))
    data = task.prepare(tmp_path / "run", True, lambda: None)
    assert isinstance(data, PrefixLMPrepared) and task.prepared is data
    assert set(vars(task)) - before == {"prepared", "run_dir", "data_dir", "primary"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.dev = []
    fresh = task_for(cfg)
    again = fresh.read_data(tmp_path / "run", False, lambda: None)
    assert vars(fresh).keys() == before
    assert again.scored == data.scored and again.geometry == data.geometry
    assert len(again.dev) == len(data.dev) and all(
        np.array_equal(a[k], b[k]) for a, b in zip(again.dev, data.dev) for k in a)
