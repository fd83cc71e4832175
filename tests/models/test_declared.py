"""Each parameter's logical axes and weight decay are declared by the module that creates it
(models/declared.py), and the trainer reads them from the model: the sharding of every model
kind, the decay mask, an undeclared parameter named, and a trainer that names no parameter."""
import re
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from jaxdepth.config.cli import parse_args
from jaxdepth.config import MeshConfig
from jaxdepth.models.specs import EncoderConfig
from jaxdepth.models.declared import Declared, decay_mask, logical_axes
from jaxdepth.models.encoder import Encoder
from jaxdepth.models.fused import FusedModel
from jaxdepth.models.fusions import fusion_methods
from jaxdepth.tasks import task_for
from jaxdepth.trainer import sharding

REPO = Path(__file__).resolve().parents[2]


def _abstract(argv):
    task = task_for(parse_args(argv))
    return eqx.filter_eval_shape(task.build_model, key=jax.random.key(0))


def _flat(tree, values):
    return {jax.tree_util.keystr(p): v for (p, _), v in
            zip(jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(values))}


def _flat_axes(tree):
    axes = tree.logical_axes()
    out = {}
    for path, _ in jax.tree_util.tree_leaves_with_path(tree):
        node = axes
        for k in path:
            node = getattr(node, k.name)
        out[jax.tree_util.keystr(path)] = node
    return out


def test_the_decoders_axes_and_decay():
    model = _abstract([])
    axes = _flat_axes(model)
    assert axes[".embed"] == ("vocab", "embed") and axes[".lm_head"] == ("embed", "vocab")
    assert axes[".blocks.attn.wq"] == ("layers", "embed", "heads")  # stacked: one more axis
    assert axes[".blocks.attn.wo"] == ("layers", "heads", "embed")
    assert axes[".blocks.mlp.wo"] == ("layers", "mlp", "embed")
    assert axes[".rel_bias.table"] == ("buckets", "heads")
    no_decay = {k for k, v in _flat(model, model.decay_mask()).items() if not v}
    assert no_decay == {".blocks.attn_norm.scale", ".blocks.mlp_norm.scale", ".final_norm.scale"}


def test_the_act_encoders_axes_and_decay():
    model = _abstract(["--preset", "act-tiny"])
    axes = _flat_axes(model)
    assert axes[".layer.attn.q.w"] == ("embed", "heads") and axes[".layer.attn.q.b"] == ("norm",)
    assert axes[".layer.ff_in.b"] == ("mlp",) and axes[".layer.ff_out.w"] == ("mlp", "embed")
    assert axes[".halt_b"] == () and axes[".embed.token_VE"] == ("vocab", "norm")
    no_decay = {k for k, v in _flat(model, model.decay_mask()).items() if not v}
    biases = {f".layer.attn.{p}.b" for p in "qkvo"} | {".layer.ff_in.b", ".layer.ff_out.b"}
    norms = {f".{m}.{f}" for m in ("layer.attn_norm", "layer.ff_norm", "embed.norm", "mlm.norm")
             for f in ("scale", "bias")}
    heads = {".embed.proj.b", ".mlm.dense.b", ".mlm.bias_V", ".sop.pooler.b", ".sop.classifier.b"}
    assert no_decay == biases | norms | heads | {".halt_b"}
    assert axes[".halt_w_D"] == ("norm",) and ".halt_w_D" not in no_decay


@pytest.mark.fake_devices
@pytest.mark.parametrize("method", fusion_methods())
def test_every_fusion_method_shards_on_a_mesh(method):
    """ScalarMix had no entry in the trainer's former table of parameter names: any mesh
    failed with a KeyError. Declared where they are created, every method's axes exist."""
    cfg = EncoderConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                        max_positions=16)
    model = eqx.filter_eval_shape(
        lambda k: FusedModel(Encoder(cfg, key=k), method=method, frozen_backbone=False,
                             n_labels=5, key=k),
        jax.random.key(0))
    mesh = sharding.make_mesh(MeshConfig(data=4, model=2))
    shardings = sharding.param_shardings(model, mesh, fsdp=True)
    flat = _flat(model, jax.tree.map(lambda s: s.spec, shardings,
                                     is_leaf=lambda s: isinstance(s, jax.sharding.NamedSharding)))
    assert flat[".backbone.layers.attn.q.w"] == jax.sharding.PartitionSpec(None, "data", "model")
    assert flat[".backbone.embed.word_VD"] == jax.sharding.PartitionSpec("model", None)


class _Undeclared(Declared):
    w: jax.Array

    def __init__(self):
        self.w = jnp.zeros((2, 3))


def test_an_undeclared_parameter_is_named():
    with pytest.raises(TypeError, match=r"test_declared\._Undeclared declares no logical axes "
                                        r"for its parameter 'w' \(its AXES\)"):
        logical_axes(_Undeclared())
    assert jax.tree.leaves(decay_mask(_Undeclared())) == [True]


def test_the_trainer_names_no_model_parameter():
    """Every field a model declares axes for, read from the models' source, appears in no
    string of jaxdepth/trainer/."""
    declared = set()
    for path in (REPO / "jaxdepth" / "models").rglob("*.py"):
        for table in re.findall(r"AXES(?:, NO_DECAY)? = (\{[^}]*\})", path.read_text()):
            declared |= set(re.findall(r'"(\w+)":', table))
    assert {"wq", "wi_0", "token_VE", "halt_b", "bias_V", "s", "gamma"} <= declared
    # "embed" is also a logical axis, the vocabulary the trainer does use (sharding.RULES)
    specific = declared - set(sharding.RULES)
    for path in (REPO / "jaxdepth" / "trainer").glob("*.py"):
        strings = set(re.findall(r'"(\w+)"', path.read_text()))
        assert not strings & specific, (path.name, strings & specific)
