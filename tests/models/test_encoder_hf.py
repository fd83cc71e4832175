"""HF BERT/RoBERTa import: a NumPy reference of HF's forward, safetensors I/O, errors, scan path."""
import json
import math
from collections.abc import Mapping
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxdepth.models.specs import EncoderConfig
from jaxdepth.models.encoder import Encoder
from jaxdepth.models.hf_import import (CONFIG_FILE, SAFETENSORS_FILE, config_from_hf,
                                       load_hf_encoder, read_safetensors)

V, D, N, L, F, P = 50, 32, 2, 3, 64, 40


# Hugging Face checkpoints of the tests' own making (the importer only reads them).

def write_safetensors(path: str | Path, arrays: Mapping[str, np.ndarray],
                      dtype: str | None = None, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``arrays``; ``dtype`` ("F32", "F16", "BF16") converts floating arrays on the way
    (BF16 rounds to nearest even, as XLA converts)."""
    to = {None: None, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
    if dtype not in to:
        raise ValueError(f"dtype must be None, 'F32', 'F16' or 'BF16', got {dtype!r}")
    out = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if to[dtype] is not None and (np.issubdtype(a.dtype, np.floating)
                                      or a.dtype.name == "bfloat16"):
            a = a.astype(to[dtype])
        out[name] = a
    meta = {str(k): str(v) for k, v in (metadata or {}).items()} or None
    save_file(out, str(path), metadata=meta)


def save_hf_checkpoint(directory: str | Path, arrays: Mapping[str, np.ndarray], config: Mapping,
                       *, dtype: str | None = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (HF layout) into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
    write_safetensors(d / SAFETENSORS_FILE, arrays, dtype=dtype, metadata={"format": "pt"})
    return d



def hf_config(model_type="bert", sizes=None, heads=None):
    """An HF config.json of a BERT/RoBERTa; sizes = (V, D, L, F, P) and heads, default the
    module's (random_arrays' sizes)."""
    V, D, L, F, P = sizes or (globals()["V"], globals()["D"], globals()["L"], globals()["F"],
                              globals()["P"])
    cfg = {"model_type": model_type, "vocab_size": V, "hidden_size": D,
           "num_attention_heads": heads or N,
           "num_hidden_layers": L, "intermediate_size": F, "max_position_embeddings": P,
           "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "pad_token_id": 0}
    if model_type == "roberta":
        cfg.update(pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5)
    return cfg


def random_arrays(model_type="bert", seed=0, prefix=None, heads=True, sizes=None):
    """HF-named tensors of a random BERT/RoBERTa; sizes = (V, D, L, F, P), default the module's."""
    V, D, L, F, P = sizes or (globals()["V"], globals()["D"], globals()["L"], globals()["F"],
                              globals()["P"])
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.normal(0, 0.2, s).astype(np.float32)  # noqa: E731
    types = 1 if model_type == "roberta" else 2
    a = {"embeddings.word_embeddings.weight": r(V, D),
         "embeddings.position_embeddings.weight": r(P, D),
         "embeddings.token_type_embeddings.weight": r(types, D),
         "embeddings.LayerNorm.weight": 1 + r(D), "embeddings.LayerNorm.bias": r(D)}
    for i in range(L):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            a[p + f"attention.self.{n}.weight"] = r(D, D)
            a[p + f"attention.self.{n}.bias"] = r(D)
        a[p + "attention.output.dense.weight"] = r(D, D)
        a[p + "attention.output.dense.bias"] = r(D)
        a[p + "attention.output.LayerNorm.weight"] = 1 + r(D)
        a[p + "attention.output.LayerNorm.bias"] = r(D)
        a[p + "intermediate.dense.weight"] = r(F, D)  # torch Linear: [out, in]
        a[p + "intermediate.dense.bias"] = r(F)
        a[p + "output.dense.weight"] = r(D, F)
        a[p + "output.dense.bias"] = r(D)
        a[p + "output.LayerNorm.weight"] = 1 + r(D)
        a[p + "output.LayerNorm.bias"] = r(D)
    if prefix:
        a = {prefix + k: v for k, v in a.items()}
    if heads:
        a["pooler.dense.weight" if not prefix else prefix + "pooler.dense.weight"] = r(D, D)
        a["cls.predictions.bias"] = r(V)
    return a


# ------------------------------------------------------------------ NumPy reference (HF BERT)

def _ln(x, w, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _lin(x, a, name):
    return x @ a[name + ".weight"].astype(np.float64).T + a[name + ".bias"]


def hf_reference(a, cfg, tokens, mask, types):
    """HF BertModel / RobertaModel forward (eval); returns (last, [layer outputs])."""
    eps = cfg["layer_norm_eps"]
    D, N, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    if cfg["model_type"] == "roberta":
        pad = cfg["pad_token_id"]
        m = (tokens != pad).astype(np.int64)
        pos = np.cumsum(m, axis=1) * m + pad  # create_position_ids_from_input_ids
    else:
        pos = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    e = "embeddings."
    x = (a[e + "word_embeddings.weight"][tokens] + a[e + "position_embeddings.weight"][pos]
         + a[e + "token_type_embeddings.weight"][types]).astype(np.float64)
    x = _ln(x, a[e + "LayerNorm.weight"], a[e + "LayerNorm.bias"], eps)
    B, T, _ = x.shape
    H = D // N
    ext = (1.0 - mask[:, None, None, :].astype(np.float64)) * np.finfo(np.float64).min
    outs = []
    for i in range(L):
        p = f"encoder.layer.{i}."
        heads = lambda y: y.reshape(B, T, N, H).transpose(0, 2, 1, 3)  # noqa: E731
        q = heads(_lin(x, a, p + "attention.self.query"))
        k = heads(_lin(x, a, p + "attention.self.key"))
        v = heads(_lin(x, a, p + "attention.self.value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(H) + ext
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = (s / s.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(0, 2, 1, 3).reshape(B, T, D)
        h = _ln(_lin(ctx, a, p + "attention.output.dense") + x,
                a[p + "attention.output.LayerNorm.weight"],
                a[p + "attention.output.LayerNorm.bias"], eps)
        f = _lin(_gelu(_lin(h, a, p + "intermediate.dense")), a, p + "output.dense")
        x = _ln(f + h, a[p + "output.LayerNorm.weight"], a[p + "output.LayerNorm.bias"], eps)
        outs.append(x)
    return x, outs


def _inputs(cfg, seed=1):
    rng = np.random.default_rng(seed)
    pad = cfg["pad_token_id"]
    tokens = rng.integers(3, V, (2, 9))
    mask = np.ones((2, 9), np.int64)
    tokens[1, 6:], mask[1, 6:] = pad, 0
    types = rng.integers(0, cfg["type_vocab_size"], (2, 9))
    return tokens, mask, types


@pytest.mark.parametrize("model_type,prefix", [("bert", None), ("bert", "bert."),
                                               ("roberta", "roberta.")])
def test_matches_hf_reference(tmp_path, model_type, prefix):
    cfg = hf_config(model_type)
    arrays = random_arrays(model_type, prefix=prefix)
    save_hf_checkpoint(tmp_path, arrays, cfg)
    model, ecfg, tok = load_hf_encoder(tmp_path)
    assert tok is None
    assert ecfg.position_offset == (2 if model_type == "roberta" else 0)
    assert ecfg.activation == "gelu" and ecfg.n_layers == L
    tokens, mask, types = _inputs(cfg)
    h, states = model(jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool),
                      jnp.asarray(types, jnp.int32))
    assert h.shape == (2, 9, D) and states.shape == (L, 2, 9, D)
    plain = {k[len(prefix):] if prefix and k.startswith(prefix) else k: v
             for k, v in arrays.items()}
    ref_h, ref_states = hf_reference(plain, cfg, tokens, mask, types)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(h)[real], ref_h[real], atol=1e-4, rtol=1e-4)
    for i in range(L):
        np.testing.assert_allclose(np.asarray(states[i])[real], ref_states[i][real],
                                   atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(np.asarray(states[-1]), np.asarray(h))


def test_scan_equals_unrolled(tmp_path, getkey):
    cfg = EncoderConfig(vocab_size=V, d_model=D, n_layers=L, n_heads=N, d_ff=F, max_positions=P)
    model = Encoder(cfg, key=getkey())
    tokens = jax.random.randint(getkey(), (2, 7), 0, V)
    mask = jnp.arange(7)[None] < jnp.array([[7], [4]])
    run = eqx.filter_jit(lambda m, k: m(tokens, mask, key=k))
    unrolled = model.with_options(scan_layers=False)
    for k in (None, getkey()):  # without dropout, then with it: same key per layer on both paths
        h_s, st_s = run(model, k)
        h_u, st_u = run(unrolled, k)
        np.testing.assert_allclose(np.asarray(h_s), np.asarray(h_u), atol=1e-5)
        np.testing.assert_allclose(np.asarray(st_s), np.asarray(st_u), atol=1e-5)
    with pytest.raises(ValueError, match="n_layers"):
        model.with_options(n_layers=2)


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_storage_roundtrip(tmp_path, dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 3, 200), [0.0, -0.0, 1.5, -0.15625, 65504.0 / 4]])
    x = x.astype(np.float32).reshape(5, 41)
    save_hf_checkpoint(tmp_path, {"t": x, "ids": np.arange(6, dtype=np.int64)},
                       {"model_type": "bert"}, dtype=dtype)
    got = read_safetensors(tmp_path / "model.safetensors")
    assert got["t"].dtype == np.float32 and got["t"].shape == x.shape
    np.testing.assert_array_equal(got["ids"], np.arange(6))
    if dtype == "F16":
        want = x.astype(np.float16).astype(np.float32)
    else:  # round-to-nearest-even, as XLA converts
        want = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(got["t"], want)
    np.testing.assert_allclose(got["t"], x, rtol=2.0 ** -7 if dtype == "BF16" else 1e-3)
    # the raw bytes: F16 as numpy writes them, BF16 the top half of the float32 bits
    raw = (tmp_path / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert f'"dtype":"{dtype}"'.encode() in raw[8:8 + n]


def test_bf16_checkpoint_loads(tmp_path):
    cfg = hf_config("bert")
    arrays = random_arrays("bert")
    save_hf_checkpoint(tmp_path, arrays, cfg, dtype="BF16")
    model, _, _ = load_hf_encoder(tmp_path)
    assert model.embed.word_VD.dtype == jnp.float32
    # the bf16-rounded weights as stored, through the NumPy HF forward
    stored = read_safetensors(tmp_path / "model.safetensors")
    for k, v in arrays.items():  # bf16 keeps 8 significant bits: relative error <= 2^-8
        assert stored[k].dtype == np.float32 and not np.array_equal(stored[k], v)
        np.testing.assert_array_less(np.abs(stored[k] - v), np.abs(v) * 2.0 ** -8 + 1e-30)
    tokens, mask, types = _inputs(cfg)
    h, _ = model(jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool),
                 jnp.asarray(types, jnp.int32))
    ref_h, _ = hf_reference(stored, cfg, tokens, mask, types)
    np.testing.assert_allclose(np.asarray(h), ref_h, rtol=1e-4, atol=1e-4)


def _save(tmp_path, arrays, cfg=None):
    save_hf_checkpoint(tmp_path, arrays, cfg or hf_config("bert"))
    return tmp_path


@pytest.mark.parametrize("cut", [4, 200])  # inside the length prefix; inside the weights
def test_a_truncated_weights_file_names_it(tmp_path, cut):
    st = _save(tmp_path, random_arrays()) / "model.safetensors"
    st.write_bytes(st.read_bytes()[:cut])
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors file"):
        load_hf_encoder(tmp_path)


def test_missing_tensor(tmp_path):
    a = random_arrays()
    del a["encoder.layer.1.attention.self.key.bias"]
    with pytest.raises(ValueError, match=r"missing tensor.*encoder\.layer\.1\.attention\.self\.key"):
        load_hf_encoder(_save(tmp_path, a))


def test_wrong_shape(tmp_path):
    a = random_arrays()
    a["encoder.layer.2.intermediate.dense.weight"] = np.zeros((F, D + 1), np.float32)
    with pytest.raises(ValueError, match=r"encoder\.layer\.2\.intermediate\.dense\.weight.*"
                                         r"expected \(64, 32\), got \(64, 33\)"):
        load_hf_encoder(_save(tmp_path, a))


@pytest.mark.parametrize("extra", ["encoder.layer.3.output.dense.bias",
                                   "encoder.layer.0.attention.self.rotary.weight"])
def test_unexpected_tensor(tmp_path, extra):
    a = random_arrays()
    a[extra] = np.zeros((D,), np.float32)
    with pytest.raises(ValueError, match="unexpected encoder tensor.*" + extra.replace(".", r"\.")):
        load_hf_encoder(_save(tmp_path, a))


def test_unsupported_model_type(tmp_path):
    cfg = dict(hf_config("bert"), model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="gpt2"):
        load_hf_encoder(_save(tmp_path, random_arrays(), cfg))


def test_config_validation_names_field():
    with pytest.raises(ValueError, match="n_heads"):
        EncoderConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="activation"):
        EncoderConfig(activation="swish")
    with pytest.raises(ValueError, match="layer_norm_eps"):
        EncoderConfig(layer_norm_eps=0.0)
    with pytest.raises(ValueError, match="vocab_size"):
        config_from_hf({"model_type": "bert"})


def test_real_minilm_checkpoint(minilm_dir):
    """all-MiniLM-L6-v2 (the minilm_dir fixture), a real 6-layer BERT: imported, and its layer
    states equal the NumPy HF reference forward on its real weights."""
    model, cfg, _ = load_hf_encoder(minilm_dir)
    assert cfg.n_layers == 6 and cfg.d_model == 384
    tokens = jnp.array([[101, 7592, 2088, 102, 0, 0]], jnp.int32)
    mask = tokens != 0
    h, states = jax.jit(lambda t, m: model(t, m))(tokens, mask)
    assert h.shape == (1, 6, 384) and states.shape == (6, 1, 6, 384)
    # the real weights through the NumPy HF reference forward
    hf_cfg = json.loads((minilm_dir / "config.json").read_text())
    _, want = hf_reference(read_safetensors(minilm_dir / "model.safetensors"), hf_cfg,
                           np.asarray(tokens), np.asarray(mask), np.zeros((1, 6), np.int64))
    real = np.asarray(mask)[0]
    for got, ref in zip(np.asarray(states), want):  # padded positions differ in HF too
        np.testing.assert_allclose(got[0][real], ref[0][real], rtol=1e-4, atol=1e-4)
