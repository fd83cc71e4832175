"""Load Hugging Face BERT/RoBERTa checkpoints (``config.json`` + ``model.safetensors``) into
``models.encoder.Encoder`` without torch or transformers: tensors are read with the
``safetensors`` package's NumPy API (BF16 through ``ml_dtypes``, which jax depends on).

The tensors are those of ``_EMBED`` and ``_LAYER`` below, after an optional ``bert.`` /
``roberta.`` prefix (old TF-converted checkpoints' ``LayerNorm.gamma/beta`` too); linear weights
are stored [out, in] (torch) and transposed to our [in, out]. Everything outside
``embeddings.`` / ``encoder.`` (pooler, MLM heads, classifiers) and the ``position_ids`` buffer
is ignored and reported; a missing or unexpected encoder tensor, or a wrong shape, raises
``ValueError`` naming the tensor. The tokenizer (``tokenizer.json``) needs the optional
``tokenizers`` package (not a dependency of jaxdepth), else ``load_hf_encoder`` gives None.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from .specs import EncoderConfig
from .encoder import Encoder

log = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SUPPORTED_MODEL_TYPES = ("bert", "roberta")

# ------------------------------------------------------------------------------ safetensors I/O

_HALF = ("float16", "bfloat16")


def read_safetensors(path: str | Path, names=None) -> dict[str, np.ndarray]:
    """Decode tensors (all, or only ``names``) to NumPy; F16/BF16 come back as float32 (exact:
    every half-precision value is a float32)."""
    try:
        with safe_open(str(path), framework="np") as f:
            keys = [k for k in f.keys() if names is None or k in names]
            out = {k: f.get_tensor(k) for k in keys}
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    return {k: v.astype(np.float32) if v.dtype.name in _HALF else v for k, v in out.items()}


# ------------------------------------------------------------------------------- config mapping

def config_from_hf(hf: Mapping) -> EncoderConfig:
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = hf.get("architectures")
        raise ValueError(f"unsupported model_type {model_type!r} (architectures={arch}); "
                         f"load_hf_encoder supports {SUPPORTED_MODEL_TYPES}")
    pos_type = hf.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ValueError(f"unsupported position_embedding_type {pos_type!r} (only 'absolute')")
    pad_id = hf.get("pad_token_id")
    if pad_id is None:
        pad_id = 1 if model_type == "roberta" else 0
    act = hf.get("hidden_act", "gelu")
    act = {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act)
    try:
        return EncoderConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
            d_ff=hf["intermediate_size"], max_positions=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            position_offset=pad_id + 1 if model_type == "roberta" else 0, pad_id=pad_id,
            dropout=float(hf.get("hidden_dropout_prob", 0.1)), activation=act)
    except KeyError as e:
        raise ValueError(f"config.json lacks {e.args[0]!r}") from None


# ------------------------------------------------------------------------------ tensor mapping

_EMBED = {
    "embeddings.word_embeddings.weight": lambda m: m.embed.word_VD,
    "embeddings.position_embeddings.weight": lambda m: m.embed.position_PD,
    "embeddings.token_type_embeddings.weight": lambda m: m.embed.token_type_YD,
    "embeddings.LayerNorm.weight": lambda m: m.embed.norm.scale,
    "embeddings.LayerNorm.bias": lambda m: m.embed.norm.bias,
}
# per-layer HF suffix -> (getter on the stacked PostLNLayer, transpose?)
_LAYER = {
    "attention.self.query.weight": (lambda l: l.attn.q.w, True),
    "attention.self.query.bias": (lambda l: l.attn.q.b, False),
    "attention.self.key.weight": (lambda l: l.attn.k.w, True),
    "attention.self.key.bias": (lambda l: l.attn.k.b, False),
    "attention.self.value.weight": (lambda l: l.attn.v.w, True),
    "attention.self.value.bias": (lambda l: l.attn.v.b, False),
    "attention.output.dense.weight": (lambda l: l.attn.o.w, True),
    "attention.output.dense.bias": (lambda l: l.attn.o.b, False),
    "attention.output.LayerNorm.weight": (lambda l: l.attn_norm.scale, False),
    "attention.output.LayerNorm.bias": (lambda l: l.attn_norm.bias, False),
    "intermediate.dense.weight": (lambda l: l.ff_in.w, True),
    "intermediate.dense.bias": (lambda l: l.ff_in.b, False),
    "output.dense.weight": (lambda l: l.ff_out.w, True),
    "output.dense.bias": (lambda l: l.ff_out.b, False),
    "output.LayerNorm.weight": (lambda l: l.ff_norm.scale, False),
    "output.LayerNorm.bias": (lambda l: l.ff_norm.bias, False),
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
_IGNORED_BUFFERS = ("embeddings.position_ids",)


def _canonical(name: str) -> str:
    for prefix in ("bert.", "roberta."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.endswith(".gamma"):
        name = name[:-len("gamma")] + "weight"
    elif name.endswith(".beta"):
        name = name[:-len("beta")] + "bias"
    return name


def encoder_from_tensors(tensors: Mapping[str, np.ndarray],
                         cfg: EncoderConfig) -> tuple[Encoder, list[str]]:
    """Build an ``Encoder`` from HF-named tensors; returns it and the names that were ignored."""
    abstract = eqx.filter_eval_shape(Encoder, cfg, key=jax.random.key(0))
    L = cfg.n_layers
    embed: dict[str, np.ndarray] = {}
    per_layer: dict[str, list] = {s: [None] * L for s in _LAYER}
    ignored: list[str] = []
    for raw_name, arr in tensors.items():
        name = _canonical(raw_name)
        if name in _IGNORED_BUFFERS or not name.startswith(("embeddings.", "encoder.")):
            ignored.append(raw_name)
            continue
        if name in _EMBED:
            embed[name] = (raw_name, np.asarray(arr))
            continue
        m = _LAYER_RE.match(name)
        if m is None or m.group(2) not in _LAYER or int(m.group(1)) >= L:
            raise ValueError(f"unexpected encoder tensor {raw_name!r} (model has {L} layers)")
        per_layer[m.group(2)][int(m.group(1))] = (raw_name, np.asarray(arr))

    missing = [n for n in _EMBED if n not in embed]
    missing += [f"encoder.layer.{i}.{s}" for s, v in per_layer.items() for i in range(L)
                if v[i] is None]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"missing tensor {missing[0]!r}{more}")

    getters, values = [], []
    for name, get in _EMBED.items():
        raw_name, arr = embed[name]
        _check_shape(raw_name, get(abstract).shape, arr.shape)
        getters.append(get)
        values.append(arr)
    for suffix, (get, transpose) in _LAYER.items():
        want = get(abstract.layers).shape[1:]
        stack = []
        for raw_name, arr in per_layer[suffix]:
            if transpose and arr.ndim == 2:
                arr = arr.T
                _check_shape(raw_name, want[::-1], arr.shape[::-1])
            else:
                _check_shape(raw_name, want, arr.shape)
            stack.append(arr)
        getters.append(lambda m, g=get: g(m.layers))
        values.append(np.stack(stack))
    arrays = [jnp.asarray(v, jnp.float32) for v in values]
    model = eqx.tree_at(lambda m: [g(m) for g in getters], abstract, arrays)
    leftover = [x for x in jax.tree.leaves(model) if isinstance(x, jax.ShapeDtypeStruct)]
    assert not leftover, "internal error: some Encoder parameters were not filled"
    return model, ignored


def _check_shape(name: str, expected, got) -> None:
    if tuple(expected) != tuple(got):
        raise ValueError(f"tensor {name!r} has wrong shape: expected {tuple(expected)}, "
                         f"got {tuple(got)}")


def load_hf_encoder(directory: str | Path):
    """(Encoder, EncoderConfig, tokenizer or None) from an HF model directory.

    The directory needs ``config.json`` (model_type "bert" or "roberta") and a single
    ``model.safetensors``. Heads and the pooler are ignored (logged at INFO level).
    """
    d = Path(directory)
    cfg_path = d / CONFIG_FILE
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {d}")
    hf_cfg = json.loads(cfg_path.read_text())
    cfg = config_from_hf(hf_cfg)
    st = d / SAFETENSORS_FILE
    if not st.is_file():
        hint = ""
        if (d / "model.safetensors.index.json").is_file():
            hint = " (sharded checkpoints are not supported)"
        elif (d / "pytorch_model.bin").is_file():
            hint = " (only pytorch_model.bin found: convert it to safetensors first)"
        raise FileNotFoundError(f"no {SAFETENSORS_FILE} in {d}{hint}")
    model, ignored = encoder_from_tensors(read_safetensors(st), cfg)
    if ignored:
        log.info("load_hf_encoder: ignored %d tensors: %s", len(ignored), ", ".join(ignored))
    return model, cfg, load_tokenizer(d)


def load_tokenizer(directory: str | Path):
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` if both exist, else None."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer  # optional dependency
    except ImportError:
        return None
    tok = Tokenizer.from_file(str(path))
    # tokenizer.json may store padding / truncation (sentence-transformers' pad and cut every
    # text to 128 ids): a caller that wants them sets them, nothing is cut silently.
    tok.no_padding()
    tok.no_truncation()
    return tok
