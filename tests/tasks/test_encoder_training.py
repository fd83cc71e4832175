"""MLM + SOP pretraining of the ACT encoders through the shared trainer: the objective equals
its NumPy recomputation, accumulation and sharding do not change the update, LAMB skips norms
and biases, the ponder weight moves the mean depth, and eval.py reports Table 1."""
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import Config, MeshConfig
from jaxdepth.models.specs import MLMConfig
from jaxdepth.data.corpus.mlm_sop import grammar_documents, mlm_dataset, tokenize_mlm_documents
from jaxdepth.data.corpus.tokenizer import train_tokenizer
from jaxdepth.data.embedded import grammar
from jaxdepth.models import act

ACT = {"embed_dim": 16, "d_model": 32, "n_heads": 2, "max_iters": 4, "max_len": 32}


def _cfg(run_dir=None, **sections) -> Config:
    base = {"model": {"arch": "act", "vocab_size": 128},
            "act": ACT,
            "data": {"seq_len": 32, "batch_size": 8, "grammar_docs": 300, "max_predictions": 5},
            "optim": {"name": "lamb", "lr": 5e-3, "schedule": "linear", "warmup_steps": 2,
                      "min_lr_ratio": 0.0, "weight_decay": 0.01, "b2": 0.999, "eps": 1e-6},
            "run": {"dir": str(run_dir or "unused"), "steps": 4, "eval_every": 4,
                    "save_every": 4, "log_every": 1, "progress": False, "samples": 0,
                    "eval_batches": 1}}
    for sec, vals in sections.items():
        base[sec] = {**base.get(sec, {}), **vals}
    return Config.from_dict(base)


@pytest.fixture(scope="module")
def batch():
    tok = train_tokenizer(grammar.corpus_texts(300, seed=0), 128)
    docs = tokenize_mlm_documents(grammar_documents(100, seed=1), tok)
    ds = mlm_dataset(docs, MLMConfig(seq_len=32, max_predictions=5), 128, global_batch=8, seed=0)
    return {k: jnp.asarray(v) for k, v in ds[0].items()}


def _state_and_step(cfg, mesh_cfg=MeshConfig(data=1)):
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer.sharding import make_mesh
    from jaxdepth.trainer.state import start

    mesh = make_mesh(mesh_cfg)
    # EncoderPretrainTask: its objective is encoder_objective()
    state, step, _ = start([cfg], [task_for(cfg)], mesh)

    def one(state, batch):  # a run of one: its batch and metrics on a trial axis of one
        state, m = step(state, {k: v[None] for k, v in batch.items()})
        return state, {k: v[0] for k, v in m.items()}
    return state, one, mesh


def test_objective_equals_numpy(batch):
    from jaxdepth.tasks.encoder_pretrain import encoder_objective

    cfg = _cfg(act={"halting_bias_init": -0.5})
    state, _, _ = _state_and_step(cfg)
    model = state.models().one(0)
    fn, totals = encoder_objective()
    value, metrics = fn(model, batch, None, totals(batch))

    # the three terms recomputed in NumPy from the model's logits and halting counts
    def xent(logits, labels):
        z = np.asarray(logits, np.float64)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        return -np.take_along_axis(logp, np.asarray(labels)[..., None], -1)[..., 0]

    m = model
    out = m(batch["tokens"], batch["segments"], batch["mask"])
    w = np.asarray(batch["mlm_weights"], np.float64)
    mlm_ce = xent(m.mlm_logits(out.h_BTD, batch["mlm_positions"]), batch["mlm_ids"])
    mlm = (w * mlm_ce).sum() / w.sum()
    sop = xent(m.sop_logits(out.h_BTD), batch["sop_labels"]).mean()
    real = np.asarray(batch["mask"], np.float64)
    ponder = (real * (np.asarray(out.N_BT) + np.asarray(out.R_BT))).sum(1).mean()
    for k, v in (("mlm", mlm), ("sop", sop), ("ponder", ponder)):
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5)
    np.testing.assert_allclose(float(value), mlm + sop + m.ponder_weight * ponder, rtol=1e-5)


@pytest.mark.fake_devices
@pytest.mark.parametrize("arch", ["act", "albert", "bert"])
def test_accumulation_and_sharding_leave_the_update_alone(batch, arch):
    # No warmup: the first step's learning rate must be non-zero for the weights to compare.
    cfg = _cfg(model={"arch": arch}, optim={"warmup_steps": 0})
    ref, step, _ = _state_and_step(cfg)
    before = [np.array(x) for x in jax.tree.leaves(eqx.filter(ref.model, eqx.is_array))]
    ref, m_ref = step(ref, batch)
    acc_cfg = _cfg(model={"arch": arch}, optim={"accum_steps": 2, "warmup_steps": 0})
    acc, step2, _ = _state_and_step(acc_cfg, MeshConfig(data=4, model=2))
    acc, m_acc = step2(acc, batch)
    for k in ("loss", "mlm", "sop", "ponder", "grad_norm"):
        np.testing.assert_allclose(float(m_acc[k]), float(m_ref[k]), rtol=2e-5)
    after = [np.asarray(x) for x in jax.tree.leaves(eqx.filter(ref.model, eqx.is_array))]
    assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(after, before))  # the step moved them
    for a, b in zip(jax.tree.leaves(eqx.filter(acc.model, eqx.is_array)), after):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)


def test_lamb_decays_weights_only():
    from jaxdepth.models.declared import decay_mask

    model = act.ACTEncoder(act.ACTConfig(**ACT, vocab_size=64), key=jax.random.key(0))
    mask = decay_mask(eqx.filter(model, eqx.is_array))
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
    assert flat[".layer.attn.q.w"] and flat[".layer.ff_in.w"] and flat[".embed.token_VE"]
    assert not flat[".layer.attn.q.b"] and not flat[".layer.attn_norm.scale"]
    assert not flat[".layer.ff_norm.bias"] and not flat[".mlm.bias_V"] and not flat[".halt_b"]


@pytest.mark.slow
def test_pretraining_learns_and_tau_sets_the_depth(tmp_path):
    from jaxdepth.tasks import train

    runs = {}
    for tau in (0.0, 0.05):
        # b_h = -1 at init: every token starts at the cap (4), so the ponder weight has room
        cfg = _cfg(tmp_path / f"tau{tau}", act={"tau": tau, "halting_bias_init": -1.0},
                   optim={"lr": 2e-2},
                   data={"batch_size": 16},
                   run={"steps": 60, "eval_every": 60, "save_every": 60, "log_every": 10})
        s = train(cfg)
        rows = [json.loads(line) for line in (tmp_path / f"tau{tau}" / "metrics.jsonl").read_text().splitlines()]
        train_rows = [r for r in rows if "mlm" in r]
        runs[tau] = (s, train_rows)
        assert train_rows[-1]["mlm"] < train_rows[0]["mlm"] - 0.3  # MLM loss falls (4.86 -> ~4.4)
    # a larger ponder weight gives fewer iterations (training metric and validation Table 1)
    assert runs[0.05][1][-1]["iterations"] < runs[0.0][1][-1]["iterations"] - 0.3
    it = {tau: s["table1"]["iterations"]["all"] for tau, (s, _) in runs.items()}
    assert it[0.05] < it[0.0]
    assert (tmp_path / "tau0.0" / "analysis" / "table1.md").is_file()
    assert (tmp_path / "tau0.0" / "analysis" / "cosine.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_probe_fine_tuning_from_a_pretrained_encoder(tmp_path, eval_main, capsys):
    """Pretrain a tiny ACT encoder, fine-tune it on tense and on roles: the encoder starts from
    the checkpoint under a fresh head, and the reported accuracy and per-role
    iterations equal an independent recomputation from the saved model; eval.py reproduces the
    final Table 1 of the pretraining run."""
    from jaxdepth.data.finetune.probing import ROLE_NAMES
    from jaxdepth.data.corpus.tokenizer import Tokenizer
    from jaxdepth.data.finetune.probing import make_probe_data
    from jaxdepth.tasks import load_model, train
    from jaxdepth.trainer import checkpoint as ckpt

    pre = tmp_path / "pre"
    s_pre = train(_cfg(pre, run={"steps": 6, "eval_every": 6, "save_every": 3}))
    enc, _, _ = load_model(pre, 6)

    # eval.py on the pretraining run = the trainer's own final evaluation (its main in this
    # process: a subprocess would import and compile everything again)
    capsys.readouterr()
    assert eval_main(["--run", str(pre)]) == 0
    got = json.loads(capsys.readouterr().out)["table1"]
    assert got["mlm_accuracy"] == s_pre["table1"]["mlm_accuracy"]
    assert got["iterations"]["all"] == pytest.approx(s_pre["table1"]["iterations"]["all"], abs=1e-9)

    for task, steps in (("tense", 20), ("roles", 6)):
        run = tmp_path / task
        cfg = _cfg(run, task={"name": task, "init_from": str(pre), "n_train": 512, "n_eval": 128},
                   data={"batch_size": 16},
                   optim={"name": "adamw", "lr": 3e-3, "weight_decay": 0.0},
                   run={"steps": steps, "eval_every": steps, "save_every": steps})
        if task == "roles":  # the encoder starts from the pretrained checkpoint, the head fresh
            from jaxdepth.data.corpus.pipeline import lm_iterator
            from jaxdepth.tasks import task_for
            from jaxdepth.trainer.loop import restore_or_init
            from jaxdepth.optim import make_optimizer
            from jaxdepth.trainer.sharding import make_mesh
            from jaxdepth.trainer.state import init_one
            from jaxdepth.trainer.trials import Batches, Trials

            task_ = task_for(cfg)
            task_.prepare(run, True, lambda: None)
            tx = make_optimizer(cfg.optim, cfg.run.steps)
            trials = Trials([cfg], [task_], make_mesh(cfg.mesh))
            state, _, _ = restore_or_init(trials, tx, ckpt.open_manager(run, 1),
                                          Batches([lm_iterator(task_.dataset())]))
            model = state.models().one(0)
            for a, b in zip(jax.tree.leaves(eqx.filter(model.encoder, eqx.is_array)),
                            jax.tree.leaves(eqx.filter(enc, eqx.is_array))):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            fresh = eqx.filter_jit(lambda: init_one(cfg, tx, task_))()  # compiled, as the run's
            np.testing.assert_array_equal(np.asarray(model.head.w),
                                          np.asarray(fresh.model.head.w))
        s = train(cfg)
        assert s["init_step"] == 6
        model, _, _ = load_model(run, steps)
        tok = Tokenizer.load(run / "data" / "tokenizer.model")
        data = make_probe_data(task, tok, n_train=512, n_eval=128, seed=0, seq_len=32)["test"]
        logits, o = model(jnp.asarray(data["tokens"]), jnp.asarray(data["segments"]),
                          jnp.asarray(data["mask"]))  # scan path; the task used the while loop
        pred, N = np.asarray(jnp.argmax(logits, -1)), np.asarray(o.N_BT)
        probe = json.loads((run / "analysis" / "probe.json").read_text())["test"]
        labels = data["labels"]
        valid = labels >= 0
        assert probe["accuracy"] == pytest.approx(float((pred == labels)[valid].mean()), abs=1e-9)
        assert probe["mean_iterations"] == pytest.approx(float(N[data["mask"] > 0].mean()), abs=1e-6)
        assert 0 < probe["n"] == len(labels)
        if task == "roles":
            for i, name in enumerate(ROLE_NAMES):
                if (data["roles"] == i).any():
                    assert probe["iterations_by_role"][name]["iterations"] == pytest.approx(
                        float(N[data["roles"] == i].mean()), abs=1e-6)


def test_encoder_task_config_errors():
    from jaxdepth.config.cli import parse_args
    from jaxdepth.config import ConfigError
    from jaxdepth.tasks import kind_of, task_for

    with pytest.raises(ConfigError, match="task.name"):
        kind_of(_cfg(task={"name": "semantic_parsing"}))
    with pytest.raises(ConfigError, match="task.name"):
        task_for(Config.from_dict({"task": {"name": "tense"}}))
    with pytest.raises(ConfigError, match="act.max_len"):
        kind_of(_cfg(data={"seq_len": 64}))
    # the command line refuses them before any work
    with pytest.raises(ConfigError, match="task.name"):
        parse_args(["--task.name", "tense"])
    with pytest.raises(ConfigError, match="act.max_len"):
        parse_args(["--model.arch", "act", "--act.max_len", "32", "--data.seq_len", "64"])


@pytest.mark.slow
def test_interrupted_encoder_run_resumes_bit_for_bit(tmp_path):
    from jaxdepth.tasks import load_model, train

    run = {"steps": 6, "save_every": 3, "eval_every": 6}
    train(_cfg(tmp_path / "straight", run=run))
    assert not train(_cfg(tmp_path / "resumed", run={**run, "stop_after": 3}))["done"]
    assert train(_cfg(tmp_path / "resumed", run=run))["done"]
    a, _, _ = load_model(tmp_path / "straight", 6)
    b, _, _ = load_model(tmp_path / "resumed", 6)
    for x, y in zip(jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
