"""A run's checkpoint opened for reading (eval.py): config, model, step, tokenizer, mesh."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax

from .eval_request import EvalRequest
from ..config import Config, MeshConfig
from ..data.corpus.prepare import check_vocab
from ..data.corpus.readers import read_json_file
from ..data.corpus.tokenizer import Tokenizer
from ..trainer.sharding import make_mesh
from .registry import load_model


def saved_config(run: Path) -> dict:
    """The run's resolved config.json as a dict ({} when absent: load_model names the problem)."""
    config = run / "config.json"
    return read_json_file(config, "config") if config.is_file() else {}


def load_checkpoint(run: Path, step: int | None, batch: int, tokenizer: bool = True):
    """(config, model, step, tokenizer, mesh) of a checkpoint, opened read-only. Fusion and
    BERT-encoder runs pass tokenizer=False: theirs is the backbone's (possibly a Hugging Face
    one), which their task re-reads and checks itself (the tokenizer returned is then None)."""
    # Data parallel only, over as many devices as divide the batch.
    cfg_batch = saved_config(run).get("data", {}).get("batch_size", 1)
    mesh = make_mesh(MeshConfig(data=math.gcd(batch or cfg_batch, jax.device_count())))
    model, cfg, step = load_model(run, step, mesh, label="--step")  # names a missing checkpoint
    tok = Tokenizer.load(run / "data" / "tokenizer.model") if tokenizer else None
    if tokenizer:
        check_vocab(tok, cfg.vocab_size, str(run / "data" / "tokenizer.model"), cfg.vocab_field)
    return cfg, model, step, tok, mesh


def scored_on(cfg: Config, request: EvalRequest) -> Config:
    """The run's config with eval.py's --data as its validation files and --batch as its batch
    size (the MLM-scored runs rebuild their validation batches from these)."""
    data = cfg.data
    if request.data:
        data = dataclasses.replace(data, valid=request.data)
    if request.batch:
        data = dataclasses.replace(data, batch_size=request.batch)
    return dataclasses.replace(cfg, data=data)
