"""Backbones for layer fusion: what a fusion task stacks its module on (DESIGN section 4).

A backbone is any deep model of this project whose layer outputs ``z_1..z_L`` can be read:

- ``Encoder`` (BERT/RoBERTa; trained here with ``model.arch=encoder`` or imported from a
  Hugging Face directory): its L layer outputs.
- ``ACTEncoder`` / ``UntiedEncoder`` (``act``, ``albert``, ``bert``): the states after each of
  the M iterations (for ACT, a halted token's state stays as it was when it halted).
- ``DecoderLM``: its L layer outputs (causal, before the final norm).

``task.init_from`` names the source: a directory with ``model.safetensors`` is a Hugging Face
checkpoint, any other directory is a run of this project (its latest or ``task.init_step``
checkpoint; the backbone is taken out of whatever model the run trained). Empty: a freshly
initialised backbone of ``model.arch`` with the model/act sections' shape.
"""
from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx

from jaxtyping import Array

from ..config import Config, ConfigError
from .encoder import Encoder, EncoderConfig


def is_hf_dir(path: str | Path) -> bool:
    return (Path(path) / "model.safetensors").is_file()


def bert_config(cfg: Config) -> EncoderConfig:
    """The own encoder (model.arch=encoder) from the model section; positions = data.seq_len."""
    m = cfg.model
    return EncoderConfig(vocab_size=m.vocab_size, d_model=m.d_model, n_layers=m.n_layers,
                         n_heads=m.heads, d_ff=m.d_ff, max_positions=cfg.data.seq_len,
                         dropout=m.dropout, scan_layers=m.scan_layers, remat=m.remat != "none")


def source_config(cfg: Config) -> Config:
    """The config of the run task.init_from names (for a run of this project)."""
    path = Path(cfg.task.init_from) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"task.init_from: {cfg.task.init_from} is neither a Hugging Face "
                                f"model directory (model.safetensors) nor a run (config.json)")
    return Config.from_dict(json.loads(path.read_text()))


def strip_to_backbone(model) -> eqx.Module:
    """The deep part of a trained model: EncoderMLM / EncoderClassifier -> their encoder,
    a fusion model -> its backbone; encoders and decoders are their own backbone."""
    for attr in ("backbone", "encoder"):
        if hasattr(model, attr) and isinstance(getattr(model, attr), eqx.Module):
            return strip_to_backbone(getattr(model, attr))
    return model


def build_backbone(cfg: Config, *, key: Array) -> eqx.Module:
    """A backbone with the shape task.init_from will load into it (random weights)."""
    from .build import build_model
    src = cfg.task.init_from
    if src and is_hf_dir(src):
        from .hf_import import CONFIG_FILE, config_from_hf
        hf_cfg = config_from_hf(json.loads((Path(src) / CONFIG_FILE).read_text()))
        return Encoder(hf_cfg, key=key)
    if src:
        pre = source_config(cfg)
        pre = pre.__class__.from_dict({**pre.to_dict(), "task": {}})  # its bare backbone
        return strip_to_backbone(build_model(pre, key=key))
    bare = cfg.__class__.from_dict({**cfg.to_dict(), "task": {}})
    return strip_to_backbone(build_model(bare, key=key))


def load_backbone(cfg: Config, mesh) -> tuple[eqx.Module, eqx.Module | None, int | None]:
    """(backbone with task.init_from's weights, its trained MLM head or None, step or None)."""
    src = cfg.task.init_from
    if is_hf_dir(src):
        from .hf_import import load_hf_encoder
        encoder, _, _ = load_hf_encoder(src)
        return encoder, None, None
    from ..train import checkpoint as ckpt
    try:
        model, _, step = ckpt.load_model(Path(src), cfg.task.init_step or None, mesh, cfg.mesh,
                                         label="task.init_step")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"task.init_from: {e}") from None
    head = getattr(model, "head", None) if hasattr(model, "masked_logits") else None
    return strip_to_backbone(model), head, step


def depth_and_width(backbone) -> tuple[int, int]:
    """(L, d): how many layer outputs the backbone yields and their width."""
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM
    if isinstance(backbone, Encoder):
        return backbone.cfg.n_layers, backbone.cfg.d_model
    if isinstance(backbone, (ACTEncoder, UntiedEncoder)):
        return backbone.cfg.max_iters, backbone.cfg.d_model
    if isinstance(backbone, DecoderLM):
        return backbone.cfg.n_layers, backbone.cfg.d_model
    raise ConfigError(f"task.init_from: a {type(backbone).__name__} is not a fusion backbone")


def layer_states(backbone, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 *, key: Array | None = None) -> Array:
    """z_LBTD: the output of every layer (iteration) of the backbone, embeddings excluded."""
    from .act import ACTEncoder, UntiedEncoder
    from .decoder import DecoderLM
    if isinstance(backbone, Encoder):
        return backbone(tokens_BT, mask_BT, segments_BT, key=key)[1]
    if isinstance(backbone, (ACTEncoder, UntiedEncoder)):
        return backbone(tokens_BT, segments_BT, mask_BT, key=key, return_states=True).states_MBTD
    if isinstance(backbone, DecoderLM):
        return backbone.hidden(tokens_BT, key=key, all_layers=True)[1]
    raise TypeError(f"{type(backbone).__name__} is not a fusion backbone")


def backbone_heads(backbone) -> int:
    """Attention heads of the backbone's layers (for Base+n's fresh layers)."""
    c = backbone.cfg
    return c.heads if hasattr(c, "heads") else c.n_heads


