"""The run's configuration: the sections (``--section.field value``, cli.py), and the Config
that composes them and checks which run kinds read which field (run_kinds/, each kind with its
recipe). Beside it: the optim, mesh and trials sections (optim.py, mesh.py, trials.py), the
fine-tuning sections task and fusion (finetune.py), the task names, the named presets
(presets.py), --help (help.py) and the upgrades of configs saved by earlier versions
(upgrades.py). The model owns its own sections (jaxdepth/models/config.py, act_config.py);
this package composes them. Validation happens at construction, so an impossible config never
reaches the trainer."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..fields import check_reads, positive, require, resumable, typed
from ..models.act_config import ACTConfig
from ..models.archs import arch as arch_class, arch_names
from ..models.config import ARCHS, ATTENTIONS, ModelConfig  # noqa: F401  (re-exported)
from .upgrades import upgrade
from .mesh import MeshConfig
from .optim import RECIPE_FIELDS, OptimConfig
from .run_kinds import kind_of
from .finetune import FUSION_MODES, FusionConfig, TaskConfig  # noqa: F401  (re-exported)
from .trials import TRIAL_FIELDS, TrialsConfig, optim_per_trial, parse_list
from .task_names import (FUSION_TASKS, GRAMMAR_TASKS, NO_DIR_TASKS, PROBE_TASKS,  # noqa: F401
                         TASKS)  # (re-exported)


def resumable_fields() -> frozenset[str]:
    """Every ``section.field`` declared ``resumable``."""
    return frozenset(f"{sec}.{f.name}" for sec, cls in SECTIONS.items()
                     for f in dataclasses.fields(cls) if f.metadata.get("resumable"))


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
        require(0.0 < self.mask_rate <= 1.0, "data.mask_rate",
                f"must be in (0, 1], got {self.mask_rate}")
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
    # Layout of the saved config.json; the earlier ones (1-4) are upgraded on reading
    # (Config.from_dict: upgrades.py says what each held).
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
        check_reads(self.model, "model", "arch")  # the architectures declare what they read
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
        """model.arch's class (jaxdepth/models/archs.py)."""
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
