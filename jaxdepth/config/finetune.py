"""The sections of fine-tuning: the task a run fine-tunes on (``task``) and, for layer fusion,
what sits between the backbone and the head (``fusion``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..fields import check_one_of, check_reads, one_of, positive, require, resumable
from ..models.fusions import fusion_method
from .task_names import FUSION_TASKS, GRAMMAR_TASKS, NO_DIR_TASKS, PROBE_TASKS, TASKS


@dataclass(frozen=True)
class TaskConfig:
    """Fine-tuning as a prefix LM (empty name: language-model pretraining).

    With `dir` empty the task comes from the embedded grammar (semantic_parsing or
    passivization); with `dir` set it is read in its published format from there (cogs,
    cogs_vf, geoquery, passivization).
    """
    name: str = ""  # the task trained on (see the class docstring); empty: LM pretraining
    # directory of a published task's files; empty: the embedded grammar's task
    dir: str = ""
    # run directory of a pretrained model; empty: fresh weights
    init_from: str = ""
    # checkpoint of init_from to start from; 0: its latest
    init_step: int = 0
    n_train: int = 2000  # embedded grammar: training examples
    # embedded grammar: dev/test size, and examples per generalization type
    n_eval: int = 200
    # embedded grammar splits; GeoQuery's held-out dev; periodic eval subsets; NER's sample
    seed: int = 0
    # GeoQuery (no dev split): share of train held out as dev
    dev_fraction: float = 0.1
    # comma-separated; empty: dev + the task's generalization splits
    eval_splits: str = resumable("")
    # evaluations in training score at most this many examples per split
    eval_max: int = resumable(0)
    # sequences per decoding batch; 0: data.batch_size
    eval_batch: int = resumable(0)
    # cut over-long examples (seqio style) instead of refusing them
    truncate: bool = False
    # Training rows hold several examples, attention kept inside each (seqio pack=True): the
    # same loss per example, several times the examples per step on short tasks. Dev loss
    # and decoding stay one example per row.
    pack: bool = False
    # ner: train on N * C sentences drawn with task.seed (C entity types); 0: all
    n_shot: int = 0

    def __post_init__(self):
        names = TASKS + PROBE_TASKS + FUSION_TASKS
        require(self.name in ("",) + names, "task.name",
                f"must be empty (pretraining) or one of {', '.join(names)}; got {self.name!r}")
        require(self.n_shot >= 0, "task.n_shot", f"must be >= 0, got {self.n_shot}")
        require(not self.name or bool(self.dir) or self.name in NO_DIR_TASKS,
                "task.dir",
                f"task {self.name!r} is read from its published files: set task.dir (the "
                f"embedded grammar provides only {', '.join(GRAMMAR_TASKS)})")
        require(self.init_step >= 0, "task.init_step", "must be >= 0")
        positive(self, "task", "n_train", "n_eval")
        require(0.0 < self.dev_fraction < 1.0, "task.dev_fraction", "must be in (0, 1)")
        require(self.eval_max >= 0, "task.eval_max", f"must be >= 0, got {self.eval_max}")
        require(self.eval_batch >= 0, "task.eval_batch", f"must be >= 0, got {self.eval_batch}")

    @property
    def grammar(self) -> bool:
        return not self.dir


# fusion.mode's values, in the few-shot grid's and its tables' order, with the tables' labels
FUSION_MODES = {"fe": "feature extraction (FE)", "ft": "fine-tuning (FT)"}


@dataclass(frozen=True)
class FusionConfig:
    """What sits between the backbone and the head of a fusion task (task.name ner or mlm).

    The backbone is task.init_from: a Hugging Face BERT/RoBERTa directory, or a run of this
    project (encoder, act/albert/bert, or decoder); empty: a fresh model.arch backbone."""
    # how h is made from the backbone's layer outputs (one class each: jaxdepth/models/fusions/)
    method: str = "dwatt"
    extra_layers: int = 1  # n of base+n
    # fe: backbone frozen, only the fusion module and head train | ft: all train
    mode: str = one_of("fe", tuple(FUSION_MODES))
    dropout: float = 0.1  # on h before the NER head (docs/design.md §4)
    # NER in fe mode: the frozen backbone runs once per sentence and training reads its
    # states from a cache (in memory, or memory-mapped under <run>/cache when larger than
    # cache_mib; 0: always); false reruns it every step (same results to float rounding).
    cache: bool = True
    cache_mib: int = 2048  # the state cache stays in memory up to this size (MiB)

    def __post_init__(self):
        fusion_method(self.method)  # a ConfigError naming fusion.method
        require(self.cache_mib >= 0, "fusion.cache_mib", f"must be >= 0, got {self.cache_mib}")
        require(self.extra_layers > 0, "fusion.extra_layers",
                f"must be positive, got {self.extra_layers}")
        check_reads(self, "fusion", "method")  # a method's own setting, set for another method
        check_one_of(self, "fusion")
        require(0.0 <= self.dropout < 1.0, "fusion.dropout",
                f"must be in [0, 1), got {self.dropout}")

    @property
    def frozen_backbone(self) -> bool:
        """fe: the backbone stays frozen (it runs without dropout under stop_gradient, gets no
        optimizer moments, can be cached, and the recipe gives the rest a higher rate)."""
        return self.mode == "fe"
