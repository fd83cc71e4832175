"""What the fusion jobs (NER, MLM) share: the backbone's tokenizer and its pretrained weights."""
from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax

from ..config import Config, ConfigError
from ..data.prepare import run_tokenizer, tokenizer_source
from ..data.subwords import HFWords, SentencePieceWords
from ..models.backbone import build_backbone, is_hf_dir, load_backbone


def backbone_vocab(cfg: Config) -> int:
    abstract = eqx.filter_eval_shape(build_backbone, cfg, key=jax.random.key(0))
    return abstract.cfg.vocab_size


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
        texts=texts))


def initial_fused_model(cfg: Config, mesh, fresh):
    """fresh (a FusedModel) with task.init_from's backbone weights, and the source's trained
    MLM head when the task is MLM and it has one. Returns (model or None, source step)."""
    if not cfg.task.init_from:
        return None, None
    backbone, head, step = load_backbone(cfg, mesh)
    if jax.tree.structure(eqx.filter(backbone, eqx.is_array)) != \
            jax.tree.structure(eqx.filter(fresh.backbone, eqx.is_array)):
        raise ConfigError(f"task.init_from: the backbone in {cfg.task.init_from} does not "
                          f"match the one its config describes")
    model = eqx.tree_at(lambda m: m.backbone, fresh, backbone)
    if head is not None and cfg.task.name == "mlm" and \
            jax.tree.map(lambda a: a.shape, eqx.filter(head, eqx.is_array)) == \
            jax.tree.map(lambda a: a.shape, eqx.filter(fresh.head, eqx.is_array)):
        model = eqx.tree_at(lambda m: m.head, model, head)
    return model, step
