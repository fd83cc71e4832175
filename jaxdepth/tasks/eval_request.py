"""What eval.py asks of a run: its flags (``EvalRequest``, each declared here once, with the
eval.py flag and help that argparse is built from) and the protocol a kind of run implements
to evaluate one of its checkpoints (``CheckpointEval``: every kind's Task class has it, beside
the trainer's Task of trainer/task.py, which training never asks for this)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol


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
