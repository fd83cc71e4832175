"""Where a fusion task's backbone comes from (docs/design.md §4), and what the fusion tasks
(NER, MLM) share: its weights, its tokenizer, the fused model and its FLOPs.

``task.init_from`` names the source: a directory with ``model.safetensors`` is a Hugging Face
BERT/RoBERTa checkpoint; any other directory is a run of this project (its latest or
``task.init_step`` checkpoint; the backbone is taken out of whatever model the run trained:
the BERT encoder, an ACT/ALBERT/BERT encoder or the decoder). Empty: a freshly initialised
backbone of ``model.arch`` with the config's shape.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array

from ..config import Config, ConfigError
from ..data.corpus.readers import read_json_file
from ..errors import DataError, one_line, warn
from ..data.corpus.prepare import run_tokenizer, tokenizer_source
from ..data.corpus.subwords import HFWords, SentencePieceWords
from ..models.backbone import strip_to_backbone
from ..models.encoder import Encoder
from ..models.fused import FusedModel
from ..models.fusions import fusion_method
from ..data.download import registered_model, verify_pretrained
from ..models.hf_import import CONFIG_FILE, config_from_hf, load_hf_encoder
from .task_base import TaskBase
from .registry import load_init_from, task_for


def is_hf_dir(path: str | Path) -> bool:
    return (Path(path) / "model.safetensors").is_file()


@contextmanager
def _hf_errors(src: str):
    """The importer's ValueErrors are about the files of the Hugging Face directory (an
    unsupported model type, a missing or misshapen tensor): the user's input."""
    try:
        yield
    except DataError:
        raise
    except ValueError as e:
        raise DataError(f"task.init_from: {src}: {one_line(e)}") from e


def source_config(cfg: Config) -> Config:
    """The config of the run task.init_from names (for a run of this project)."""
    path = Path(cfg.task.init_from) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"task.init_from: {cfg.task.init_from} is neither a Hugging Face "
                                f"model directory (model.safetensors) nor a run (config.json)")
    return Config.from_dict(read_json_file(path, "config"))


def _bare(cfg: Config) -> Config:
    """cfg without its task: the run that trains the backbone alone."""
    return Config.from_dict({**cfg.to_dict(), "task": {}})


def build_backbone(cfg: Config, *, key: Array) -> eqx.Module:
    """A backbone with the shape task.init_from will load into it (random weights)."""
    src = cfg.task.init_from
    if src and is_hf_dir(src):
        with _hf_errors(src):
            hf_config = config_from_hf(read_json_file(Path(src) / CONFIG_FILE, "config"))
        return Encoder(hf_config, key=key)
    bare = _bare(source_config(cfg) if src else cfg)
    return strip_to_backbone(task_for(bare).build_model(key=key))


def load_backbone(cfg: Config, mesh) -> tuple[eqx.Module, eqx.Module | None, int | None]:
    """(backbone with task.init_from's weights, its trained MLM head or None, step or None)."""
    src = cfg.task.init_from
    if is_hf_dir(src):
        if (name := registered_model(src)) is not None:  # the downloader's: its bytes, checked
            verify_pretrained(src, name)
        with _hf_errors(src):
            encoder, _, _ = load_hf_encoder(src)
        return encoder, None, None
    model, _, step = load_init_from(cfg, mesh)
    head = getattr(model, "head", None) if hasattr(model, "masked_logits") else None
    return strip_to_backbone(model), head, step


def backbone_vocab(cfg: Config) -> int:
    abstract = eqx.filter_eval_shape(build_backbone, cfg, key=jax.random.key(0))
    return abstract.cfg.vocab_size


def check_positions(cfg: Config) -> None:
    """Refuse a data.seq_len longer than task.init_from's backbone has positions (an encoder's
    max_positions, ACT's max_len; a decoder's relative positions have no limit): every
    sequence (an NER sentence, an MLM window) is data.seq_len pieces, which the embedding
    would refuse only once the model first runs, with a traceback. Built abstractly from the
    source's config, before the run directory is touched. A fresh backbone fits by
    construction (an encoder gets data.seq_len positions; act.max_len is checked with the
    config)."""
    src = cfg.task.init_from
    if not src:
        return
    backbone = eqx.filter_eval_shape(build_backbone, cfg, key=jax.random.key(0))
    limit = getattr(backbone.cfg, "max_len", None)
    if limit is not None and cfg.data.seq_len > limit:
        raise ConfigError(f"data.seq_len: {cfg.data.seq_len} is longer than the backbone of "
                          f"task.init_from {src} takes ({limit} positions); lower "
                          f"--data.seq_len to {limit} or less", field="data.seq_len")


class FusionTask(TaskBase):
    """A backbone + fusion module + head (docs/design.md §4): NER or MLM."""

    n_labels = 0  # NER: its label count; MLM: the head is the vocabulary

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        # its class (models/fusions/): a ConfigError naming fusion.method for an unknown one
        self.fusion_method = fusion_method(cfg.fusion.method)
        check_positions(cfg)

    def build_model(self, *, key):
        cfg, f = self.cfg, self.cfg.fusion
        k_bb, k_top = jax.random.split(key)
        return FusedModel(build_backbone(cfg, key=k_bb), method=f.method,
                          frozen_backbone=f.frozen_backbone, n_labels=self.n_labels,
                          mlm=not self.n_labels,
                          n_extra=f.extra_layers, rate=f.dropout, key=k_top)

    def trial_shared(self, model):
        # task.init_from's backbone, when it stays frozen (fusion.mode fe): the same arrays in
        # every trial, which no trial updates (the head, even one loaded too, trains)
        if not self.cfg.task.init_from or not model.frozen_backbone:
            return None
        spec = jax.tree.map(lambda _: False, model)
        return eqx.tree_at(lambda m: m.backbone, spec, jax.tree.map(lambda _: True, spec.backbone))

    def initial_model(self, mesh, fresh):
        """fresh with task.init_from's backbone weights, and the source's trained MLM head
        when the task is MLM and it has one (None without a source)."""
        cfg = self.cfg
        if not cfg.task.init_from:
            return None
        backbone, head, step = load_backbone(cfg, mesh)
        if jax.tree.structure(eqx.filter(backbone, _shaped)) != \
                jax.tree.structure(eqx.filter(fresh.backbone, _shaped)):
            raise ConfigError(f"task.init_from: the backbone in {cfg.task.init_from} does not "
                              f"match the one its config describes")
        self.started_from(step)
        model = eqx.tree_at(lambda m: m.backbone, fresh, backbone)
        if head is not None and not self.n_labels:
            if jax.tree.map(lambda a: a.shape, eqx.filter(head, _shaped)) == \
                    jax.tree.map(lambda a: a.shape, eqx.filter(fresh.head, _shaped)):
                model = eqx.tree_at(lambda m: m.head, model, head)
            elif jax.process_index() == 0:
                warn(f"task.init_from: the MLM head of {cfg.task.init_from} does not fit this "
                     f"model's head (other shapes); training starts from a fresh head")
        return model


def _shaped(x) -> bool:
    """An array leaf, concrete or abstract (initial_model sees the abstract fresh model)."""
    return isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))


def backbone_words(cfg: Config, run_dir: Path, primary: bool, barrier, texts):
    """The backbone's word -> pieces tokenizer: a Hugging Face tokenizer.json, the source
    run's SentencePiece model (copied into this run), or one trained on texts() for a fresh
    backbone."""
    src = cfg.task.init_from
    vocab = backbone_vocab(cfg)
    if src and is_hf_dir(src):
        words = HFWords(src)
        if words.vocab_size > vocab:
            raise ConfigError(f"task.init_from: tokenizer.json has {words.vocab_size} pieces but "
                              f"the checkpoint's embeddings only {vocab}")
        return words
    return SentencePieceWords(run_tokenizer(
        run_dir, vocab, primary, barrier, copy_from=tokenizer_source(src, cfg.data.tokenizer),
        texts=texts, model_type=cfg.data.tokenizer_type))
