"""Frozen, validated configuration: the command-line sections (which run kinds read a field; the
kinds and their recipes are jaxdepth/run_kinds/). Elsewhere: the trials section and its grid
(trial_grid.py), the settings a trial step traces (trial_tracing.py), the layouts of saved
configs (layouts.py), the specs the tasks derive from the sections (model_specs.py), the token
ids (token_ids.py), how fields are declared and checked (fields.py), the optim, act and mesh
sections (optim_config.py, act_config.py, mesh_config.py), Eq. 1's depth families
(depth_family.py) and the named presets (presets.py, act_presets.py).

Every field is overridable from the command line as ``--section.field value`` (see cli.py).
Validation happens at construction, so an impossible config never reaches the trainer.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import ClassVar

from .act_config import ACTConfig
from .archs import arch as arch_class, arch_names, archs_reading
from .attentions import attention_names, attention_path  # also the models'
from .errors import ConfigError
from .fields import check_settings, positive, require, resumable, typed
from .fusion_modes import fusion_mode  # also the models' (they import only this module)
from .halting import halting as halting_class  # noqa: F401  (the models')
from .layouts import upgrade
from .mesh_config import MeshConfig
from .optim_config import RECIPE_FIELDS, OptimConfig
from .run_kinds import kind_of
from .trial_grid import TRIAL_FIELDS, TrialsConfig, optim_per_trial, parse_list
from .task_names import (FUSION_TASKS, GRAMMAR_TASKS, NO_DIR_TASKS, PROBE_TASKS,  # noqa: F401
                         TASKS)  # (re-exported)


def resumable_fields() -> frozenset[str]:
    """Every ``section.field`` declared ``resumable``."""
    return frozenset(f"{sec}.{f.name}" for sec, cls in SECTIONS.items()
                     for f in dataclasses.fields(cls) if f.metadata.get("resumable"))


ATTENTIONS = attention_names()  # model.attention: one class each in attentions.py


ARCHS = arch_names()  # model.arch: one class each in archs.py, with the section it reads


@dataclass(frozen=True)
class ModelConfig:
    """The model of model.arch decoder (T5) or encoder (BERT/RoBERTa), and the choice of
    architecture for every run. For act, albert and bert the model is the act section, and
    only model.arch is read here."""
    # Fields that fix parameter shapes (or what the weights mean): a checkpoint only loads into
    # a model that agrees on them. Every other field is a run-time option.
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "d_model", "n_layers", "d_ff", "n_heads",
                                        "rel_buckets", "rel_max_distance")
    vocab_size: int = 512  # tokenizer pieces = embedding rows (a trained tokenizer gets this size)
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # depth (a depth family trades it for d_ff at equal size: Eq. 1)
    d_ff: int = 512  # hidden width of each gated-GELU feed-forward block
    # The decoder computes its feed-forward blocks with d_ff zero-padded up to a multiple of
    # this (Eq. 1's odd widths are slow matmul shapes on a GPU); the weights keep d_ff and the
    # padding is exact. -1: 128 on a GPU/TPU, 1 (no padding) on the CPU
    d_ff_multiple: int = resumable(-1)
    n_heads: int = 0  # 0 -> d_model // 64 (at least 1); d_attn = d_model either way
    rel_buckets: int = 32  # T5 relative-position buckets (all layers)
    # distance beyond which relative positions share a bucket
    rel_max_distance: int = 128
    dropout: float = 0.0  # dropout rate in every layer (decoder / encoder); 0 off
    # weight of the z-loss log(Z)^2 on the output logits; 0 off
    z_loss: float = 0.0
    # parameters stay float32; "bfloat16" computes in bf16
    compute_dtype: str = "float32"
    remat: str = resumable("none")  # none | full | dots (save matmul outputs, recompute the rest)
    scan_layers: bool = resumable(True)  # False runs a Python loop over layers (tests, debugging)
    # layers per scan iteration; 0: all of them up to 2 layers, else 1
    scan_unroll: int = resumable(0)
    # tokens per chunk of the fused output-projection + loss; 0: unfused
    xent_chunk: int = resumable(2048)
    # The decoder's training/eval attention (one class each in jaxdepth/attentions.py): einsum
    # (our own, the reference) | dot_product (jax.nn.dot_product_attention,
    # implementation=None: XLA's path in jax 0.10) | cudnn (the same call forcing cuDNN's
    # fused flash kernel: GPU only, bf16 compute).
    attention: str = resumable("einsum")
    # decoder | act (ACT encoder) | albert (weight-tied, fixed M) | bert (untied, ALBERT
    # embeddings) | encoder (BERT/RoBERTa of models/encoder.py: MLM pretraining, fusion
    # backbone); one class each in jaxdepth/archs.py
    arch: str = "decoder"

    def __post_init__(self):
        positive(self, "model", "vocab_size", "d_model", "n_layers", "d_ff",
                 "rel_buckets", "rel_max_distance")
        require(self.n_heads >= 0, "model.n_heads", f"must be >= 0, got {self.n_heads}")
        require(self.d_model % self.heads == 0, "model.n_heads",
                f"d_model={self.d_model} is not divisible by n_heads={self.heads}")
        require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        require(self.z_loss >= 0.0, "model.z_loss", f"must be >= 0, got {self.z_loss}")
        require(self.compute_dtype in ("float32", "bfloat16"), "model.compute_dtype",
                f"must be float32 or bfloat16, got {self.compute_dtype!r}")
        require(self.remat in ("none", "full", "dots"), "model.remat",
                f"must be none, full or dots, got {self.remat!r}")
        require(self.scan_unroll >= 0, "model.scan_unroll", "must be >= 0")
        require(self.d_ff_multiple == -1 or self.d_ff_multiple > 0, "model.d_ff_multiple",
                f"must be -1 or positive, got {self.d_ff_multiple}")
        require(self.xent_chunk >= 0, "model.xent_chunk", "must be >= 0")
        attention_path(self.attention).check(self)  # ConfigErrors naming model.attention
        arch_class(self.arch)  # a ConfigError naming model.arch

    @property
    def heads(self) -> int:
        return self.n_heads or max(1, self.d_model // 64)

    def shape(self) -> dict[str, int]:
        """The SHAPE fields as the model uses them (n_heads=0, automatic, is the derived
        count), so two configs of one shape compare equal however they spell it."""
        return {f: self.heads if f == "n_heads" else getattr(self, f) for f in self.SHAPE}

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def dims(self) -> tuple:
        """(layers run, d_model, d_ff, heads, remat, loss chunk): trainer/memory.py's inputs."""
        return self.n_layers, self.d_model, self.d_ff, self.heads, self.remat, self.xent_chunk


@dataclass(frozen=True)
class DataConfig:
    # "grammar" (embedded) or comma-separated files, directories, globs
    corpus: str = "grammar"
    # the same for validation; empty -> split off valid_fraction (not streaming)
    valid: str = ""
    # tokenize and pack on the fly from the files (data/corpus/streaming.py)
    streaming: bool = False
    # streaming: file streams (fixes the data order; hosts split them)
    streams: int = 8
    # streaming: loader processes per host; 0 = a thread of the trainer
    workers: int = 0
    # On resume, start the data stream afresh at the restored step on the corpus as it is now
    # (e.g. shards appended) instead of refusing a changed corpus; the token-file path
    # re-tokenizes it with the run's tokenizer (data/corpus/streaming.py,
    # data/corpus/prepare.py). Every resume given it restarts.
    restart_stream: bool = resumable(False)
    # streaming: documents the tokenizer is trained on
    tokenizer_sample: int = 50_000
    # documents held out for validation when data.valid is empty
    valid_fraction: float = 0.05
    # which documents valid_fraction holds out (any corpus)
    valid_seed: int = 1234
    # enough that the default run's 400 steps see each about twice
    grammar_docs: int = 20000
    grammar_seed: int = 1234  # the embedded grammar's documents
    tokenizer: str = ""  # an existing SentencePiece .model; empty -> train one into the run dir
    # The SentencePiece algorithm of a trained tokenizer. unigram is T5's; at a few hundred
    # pieces bpe keeps frequent words and symbols whole (COGS: 56 pieces per example, not 97).
    tokenizer_type: str = "unigram"
    seq_len: int = 128  # tokens per training sequence (window, packed row or encoder input)
    batch_size: int = 32  # global batch, in sequences, per optimizer step
    # encoders (MLM): share of tokens to predict
    mask_rate: float = 0.15
    max_predictions: int = 20  # encoders (MLM): cap per sequence (ALBERT's)
    max_ngram: int = 3  # encoders (MLM): longest masked n-gram of words

    def __post_init__(self):
        positive(self, "data", "seq_len", "batch_size", "grammar_docs", "max_predictions",
                 "max_ngram")
        require(0.0 < self.mask_rate <= 1.0, "data.mask_rate", f"must be in (0, 1], got {self.mask_rate}")
        require(0.0 <= self.valid_fraction < 1.0, "data.valid_fraction",
                f"must be in [0, 1), got {self.valid_fraction}")
        require(bool(self.corpus.strip()), "data.corpus", "must be 'grammar' or file paths")
        positive(self, "data", "streams", "tokenizer_sample")
        require(self.tokenizer_type in ("unigram", "bpe"), "data.tokenizer_type",
                f"must be unigram or bpe, got {self.tokenizer_type!r}")
        require(self.workers >= 0, "data.workers", f"must be >= 0, got {self.workers}")
        if self.streaming:  # the corpus itself is checked where it is read (tasks/lm.py)
            require(self.batch_size % self.streams == 0, "data.streams",
                    f"{self.streams} streams do not divide data.batch_size={self.batch_size}")


@dataclass(frozen=True)
class RunConfig:
    # the run directory: data, checkpoints, metrics, summary.json
    dir: str = resumable("runs/default")
    seed: int = 0  # initialisation, data order and dropout
    steps: int = resumable(400)  # optimizer steps in all; raising it on a finished run resumes it
    log_every: int = resumable(10)  # steps between metrics.jsonl / TensorBoard records
    eval_every: int = resumable(100)  # steps between evaluations (and one at the end)
    eval_batches: int = resumable(0)  # 0: the whole validation set
    save_every: int = resumable(100)  # steps between checkpoints (and one at the end)
    keep: int = resumable(3)  # checkpoints retained (the latest ones)
    # continuations sampled from the model, printed at the end
    samples: int = resumable(3)
    sample_tokens: int = resumable(24)  # tokens of each one
    # embedded grammar: sampled continuations scored by its recognizer
    grammar_samples: int = resumable(64)
    progress: bool = resumable(True)  # a progress bar on the terminal
    # >0: exit after this many steps in this invocation (tests, preemption drills)
    stop_after: int = resumable(0)
    # comma-separated run.seed values trained side by side as trials of one compiled program
    # (trainer/trials.py); empty: one run of run.seed
    seeds: str = ""

    def __post_init__(self):
        positive(self, "run", "steps", "log_every", "eval_every", "save_every", "keep")
        parse_list(self.seeds, int, "run.seeds")
        require(self.samples >= 0, "run.samples", "must be >= 0")
        require(self.grammar_samples >= 0, "run.grammar_samples", "must be >= 0")
        require(self.stop_after >= 0, "run.stop_after", "must be >= 0")


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


@dataclass(frozen=True)
class FusionConfig:
    """What sits between the backbone and the head of a fusion task (task.name ner or mlm).

    The backbone is task.init_from: a Hugging Face BERT/RoBERTa directory, or a run of this
    project (encoder, act/albert/bert, or decoder); empty: a fresh model.arch backbone."""
    # how h is made from the backbone's layer outputs (one class each: jaxdepth/models/fusions/)
    method: str = "dwatt"
    extra_layers: int = 1  # n of base+n
    # fe: backbone frozen, only the fusion module and head train | ft: all train
    # (jaxdepth/fusion_modes.py)
    mode: str = "fe"
    dropout: float = 0.1  # on h before the NER head (docs/design.md §4)
    # NER in fe mode: the frozen backbone runs once per sentence and training reads its
    # states from a cache (in memory, or memory-mapped under <run>/cache when larger than
    # cache_mib; 0: always); false reruns it every step (same results to float rounding).
    cache: bool = True
    cache_mib: int = 2048  # the state cache stays in memory up to this size (MiB)

    def __post_init__(self):
        # method is checked on the command line (cli.check_choices): its classes are models,
        # which import this module
        require(self.cache_mib >= 0, "fusion.cache_mib", f"must be >= 0, got {self.cache_mib}")
        require(self.extra_layers > 0, "fusion.extra_layers", f"must be positive, got {self.extra_layers}")
        check_settings(self, "fusion")  # a method's own setting, set for another method
        fusion_mode(self.mode)  # a ConfigError naming fusion.mode
        require(0.0 <= self.dropout < 1.0, "fusion.dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    act: ACTConfig = field(default_factory=ACTConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    trials: TrialsConfig = field(default_factory=TrialsConfig)
    preset: str = ""
    # Layout of the saved config.json: 1 (before Arch.SECTION: ACT runs read their
    # vocabulary from model.vocab_size), 2 (optim.b1/b2/eps saved for every optimizer) and 3
    # (the decoder's own model fields accepted for the encoder, model fields for fusion over
    # task.init_from) and 4 (fusion.extra_layers for every method) are upgraded on reading
    # (Config.from_dict, upgrade).
    version: int = 5

    def __post_init__(self):
        # The one section that describes the model of each architecture (Arch.SECTION): the
        # other must stay at its defaults, so a run's model is never described twice.
        mine = self.model_section
        other = "act" if mine == "model" else "model"
        for name in self.changed(other):
            users = ", ".join(a for a in arch_names() if arch_class(a).SECTION == other)
            hint = (f"set {mine}.{name} instead" if hasattr(getattr(self, mine), name)
                    else f"{other}.{name} is read for model.arch {users} only")
            raise ConfigError(f"{other}.{name}: model.arch={self.model.arch!r} is described "
                              f"by the {mine} section; {hint}", field=f"{other}.{name}")
        for name in self.changed("model"):  # the architectures declare what they read
            archs = archs_reading(f"model.{name}")
            require(archs is None or self.model.arch in archs, f"model.{name}",
                    f"model.arch={self.model.arch!r} does not read it (read for model.arch "
                    f"{', '.join(archs or ())})")
        # Which sections must agree for a given model.arch and task.name is decided by
        # run_kinds.kind_of, the one place that dispatches on them.
        require(self.data.batch_size % self.optim.accum_steps == 0, "optim.accum_steps",
                f"must divide data.batch_size={self.data.batch_size}")
        # Each architecture names the setting its model reads per trial as its dropout rate
        # (Arch.TRIAL_DROPOUT; an encoder's comes from its checkpoint as often as not).
        varied, own = TRIAL_FIELDS["dropout"][0], self.arch.TRIAL_DROPOUT
        other = [f"trials.{n} varies {s}" for n, (s, _) in TRIAL_FIELDS.items() if s == own]
        require(not self.trials.dropout or own == varied, "trials.dropout",
                f"varies the decoder's {varied}; model.arch={self.model.arch!r} does not "
                f"read it per trial" + "".join(f" ({o})" for o in other))
        if self.optim.from_recipe:
            try:
                kind = kind_of(self)
            except ConfigError:  # no task runs this config: kind_of says why where it is asked
                kind = None
            if kind is not None:
                object.__setattr__(self, "optim", self.optim.with_recipe(
                    kind.recipe(self), kind.NAME, optim_per_trial(self)))

    def changed(self, section: str) -> list[str]:
        """The fields of a section that differ from its defaults (model.arch, the choice of
        architecture, never counts)."""
        given, default = getattr(self, section), SECTIONS[section]()
        return [f.name for f in dataclasses.fields(given)
                if (section, f.name) != ("model", "arch")
                and getattr(given, f.name) != getattr(default, f.name)]

    @property
    def arch(self):
        """model.arch's class (jaxdepth/archs.py)."""
        return arch_class(self.model.arch)

    @property
    def model_section(self) -> str:
        """Which section describes this run's model: "model" or "act"."""
        return self.arch.SECTION

    @property
    def model_spec(self):
        """The model section's settings (ModelConfig or ACTConfig)."""
        return getattr(self, self.model_section)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary, which the run's tokenizer must match."""
        return self.model_spec.vocab_size

    @property
    def vocab_field(self) -> str:
        """The setting that holds vocab_size, as messages name it."""
        return f"{self.model_section}.vocab_size"

    def to_dict(self, keep_recipe: bool = False) -> dict:
        """Every section, except the fields of the model section that model.arch does not
        read (Arch.SECTION): an ACT run's model is {"arch": ...}, a decoder's has no act.
        keep_recipe: the optimizer fields taken from the run kind's recipe are None (so that
        a config built from this dict takes the recipe of its own kind); a saved config
        holds the values."""
        d = dataclasses.asdict(self)
        del d["optim"]["from_recipe"]
        if keep_recipe:
            d["optim"].update({f: None for f in self.optim.from_recipe})
        if self.model_section == "act":
            d["model"] = {"arch": self.model.arch}
        else:
            del d["act"]
        return d

    def overridden(self, overrides: dict[str, dict]) -> "Config":
        """A new Config with nested overrides applied (validated again)."""
        d = self.to_dict(keep_recipe=True)
        for sec, vals in overrides.items():
            if sec in ("preset", "version"):
                d[sec] = vals
                continue
            require(sec in SECTIONS, "config", f"unknown section {sec!r}")
            d[sec] = {**d.get(sec, {}), **vals}
        return Config.from_dict(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A Config from nested dicts (a JSON config file), every value type-checked."""
        require(isinstance(d, dict), "config",
                f"must be a JSON object of sections, got {json.dumps(d)}")
        d = upgrade(d, ModelConfig)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        require(not unknown, "config", f"unknown sections {sorted(unknown)}")
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            if f.name in ("preset", "version"):
                kw[f.name] = typed(f.name, f.type, d[f.name])
                continue
            sec_cls, values = SECTIONS[f.name], d[f.name]
            require(isinstance(values, dict), f.name,
                    f"must be a JSON object of fields, got {json.dumps(values)}")
            fields = {g.name: g for g in dataclasses.fields(sec_cls) if g.init}
            types = {n: g.type if isinstance(g.type, str) else g.type.__name__
                     for n, g in fields.items()}
            bad = set(values) - set(types)
            require(not bad, f.name, f"unknown fields {sorted(bad)}")
            values = {k: fields[k].metadata.get("words", {}).get(v, v) if isinstance(v, str)
                      else v for k, v in values.items()}
            # null: an optimizer field left to the run kind's recipe
            kw[f.name] = sec_cls(**{k: v if v is None and f.name == "optim" and k in
                                    RECIPE_FIELDS else typed(f"{f.name}.{k}", types[k], v)
                                    for k, v in values.items()})
        return cls(**kw)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
            "mesh": MeshConfig, "run": RunConfig, "task": TaskConfig, "act": ACTConfig,
            "fusion": FusionConfig, "trials": TrialsConfig}


apply_overrides = Config.overridden  # (cfg, {section: {field: value}}) -> a new Config
