"""What eval.py asks of a run: its flags (``EvalRequest``, each declared here once, with the
eval.py flag and help that argparse is built from), the protocol a kind of run implements
to evaluate one of its checkpoints (``CheckpointEval``: every kind's Task class has it, beside
the trainer's Task of trainer/task.py, which training never asks for this) and the checkpoint
opened for reading (``load_checkpoint``)."""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import jax

from ..config import Config, MeshConfig
from ..data.corpus.prepare import check_vocab
from ..data.corpus.readers import read_json_file
from ..data.corpus.tokenizer import Tokenizer
from ..trainer.sharding import make_mesh
from .registry import load_model


def _flag(name: str, default, help: str, type=str):
    return field(default=default, metadata={"flag": name, "type": type, "help": help})


@dataclass(frozen=True)
class EvalRequest:
    """What eval.py asks of a checkpoint. A kind of run reads some of these fields (its
    CheckpointEval's EVAL_READS); eval.py refuses the others when given."""

    step: int | None = _flag("--step", None, "checkpoint step (default: latest)", int)
    data: str = _flag("--data", "", "comma-separated text/JSONL files (default: the run's "
                                    "validation set)")
    batch: int = _flag("--batch", 0, "sequences per batch (default: the run's batch size)", int)
    out: str = _flag("--out", "", "LM: JSON output path (default: <run>/eval_step<N>.json); "
                                  "task: output directory (default: <run>/eval/step<N>)")
    splits: str = _flag("--splits", "", "task runs: comma-separated splits (default: the run's)")
    task_dir: str = _flag("--task-dir", "", "task runs: read the task from here instead")
    max_examples: int = _flag("--max", 0, "task runs: at most this many examples per split", int)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """eval.py's flag of each EvalRequest field (its value under the field's name)."""
    for f in dataclasses.fields(EvalRequest):
        parser.add_argument(f.metadata["flag"], dest=f.name, type=f.metadata["type"],
                            default=f.default, help=f.metadata["help"],
                            metavar=f.metadata["flag"][2:].upper().replace("-", "_"))


def request_of(args: argparse.Namespace) -> EvalRequest:
    return EvalRequest(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvalRequest)})


class CheckpointEval(Protocol):
    EVAL_READS: ClassVar[frozenset[str]]  # the EvalRequest fields evaluate_checkpoint reads

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """Evaluate a checkpoint of ``run`` (trained by this kind of run), write its files and
        return the result eval.py prints (naming the files)."""


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
