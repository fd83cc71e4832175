"""Frozen, validated configuration: the command-line sections (which run kinds read a field; the
kinds and their recipes are jaxdepth/run_kinds/), the trial grid, and the specs the tasks
derive from the sections (Eq. 1's depth families are in depth_family.py, the named presets in
presets.py).

Every field is overridable from the command line as ``--section.field value`` (see cli.py).
Validation happens at construction, so an impossible config never reaches the trainer.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .archs import arch as arch_class, arch_names
from .attentions import attention_names, attention_path  # also the models'
from .errors import ConfigError
from .run_kinds import kind_of
from .run_kinds.lm_pretraining import LMPretraining
from .optimizers import OWN_FIELDS, optimizer, optimizer_names, readers
from .fusion_modes import fusion_mode  # also the models' (they import only this module)
from .halting import halting as halting_class  # also the models'
from .schedules import schedule_class
from .task_names import FUSION_TASKS, GRAMMAR_TASKS, PROBE_TASKS, TASKS  # noqa: F401  (re-exported)


def _require(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{name}: {msg}", field=name)


# What a field's annotation accepts from a JSON config file: JSON has no separate int and
# float, so an integer is a valid float; a bool is never a number.
_ACCEPTS = {"int": ((int,), "an integer"), "float": ((int, float), "a number"),
            "bool": ((bool,), "true or false"), "str": ((str,), "a string")}


def _typed(name: str, ftype: str, value: Any) -> Any:
    """value checked against the field's declared type (floats given as integers become
    floats)."""
    kinds, what = _ACCEPTS[ftype]
    ok = isinstance(value, kinds) and (ftype == "bool" or not isinstance(value, bool))
    _require(ok, name, f"must be {what}, got {json.dumps(value)}")
    return float(value) if ftype == "float" else value


def _positive(obj: Any, section: str, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        _require(v > 0, f"{section}.{n}", f"must be positive, got {v}")



def resumable(default: Any) -> Any:
    """A field that a resumed run may change from what its checkpoint was saved with (how
    long or how visibly it trains, where it runs, how the same computation is laid out), as
    opposed to one that changes the model, the data or the optimizer."""
    return field(default=default, metadata={"resumable": True})


def read_by(*kinds: str, default: Any = dataclasses.MISSING, may_resume: bool = False) -> Any:
    """A field that only these run kinds (``kind_of``) read: given on the command line for
    another kind it is refused (``refuse_unread``), not silently ignored. A section whose
    every field is so declares ``KINDS`` instead. may_resume: also ``resumable``."""
    return field(default=default, metadata={"kinds": kinds, "resumable": may_resume})


def for_archs(*archs: str, default: Any, may_resume: bool = False) -> Any:
    """A model-section field that only these model.arch values read (the decoder's relative
    positions, say): set for another architecture it is refused (``Config``), not ignored.
    may_resume: also ``resumable``."""
    return field(default=default, metadata={"archs": archs, "resumable": may_resume})


def kinds_reading(section: str, name: str) -> tuple[str, ...] | None:
    """The run kinds that read ``section.name``; None: every kind that has the section."""
    cls = SECTIONS[section]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.metadata.get("kinds", getattr(cls, "KINDS", None))


def refuse_unread(cfg: "Config", given) -> None:
    """ConfigError for the first field of `given` (``(section, name)`` pairs the user set
    explicitly, trial lists as the field they vary) that cfg's run kind does not read."""
    kind = kind_of(cfg).NAME
    for section, name in given:
        given_as = what = f"{section}.{name}"
        if section == "trials" and name in TRIAL_FIELDS:  # the field it varies
            what += f" (varies {TRIAL_FIELDS[name][0]})"
            section, name = TRIAL_FIELDS[name][0].split(".")
        kinds = kinds_reading(section, name)
        if kinds is not None and kind not in kinds:
            raise ConfigError(f"{what}: a run of kind {kind} does not read it (read by: "
                              f"{', '.join(kinds)})", field=given_as)


def refuse_shadowed(cfg: "Config", given) -> None:
    """ConfigError for the first field of `given` (``(section, name)`` pairs the user set
    explicitly) that a list of cfg's trials sets in every trial (``per_trial``), where the
    value given would go unused. The list may come from a config file: the field given is
    dropped all the same; a field a config file or preset sets is not checked, since those
    hold every field."""
    lists = per_trial(cfg)
    for section, name in given:
        setting = f"{section}.{name}"
        if setting in lists:
            raise ConfigError(f"{setting}: given with {lists[setting]}, which sets it for every "
                              f"trial; give one of them", field=setting)


def resumable_fields() -> frozenset[str]:
    """Every ``section.field`` declared ``resumable``."""
    return frozenset(f"{sec}.{f.name}" for sec, cls in SECTIONS.items()
                     for f in dataclasses.fields(cls) if f.metadata.get("resumable"))

# The token ids of every tokenizer this project trains (data/corpus/tokenizer.py): T5's pad,
# eos and unk, then the encoders' [CLS], [SEP] and [MASK] as fixed user-defined symbols.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
CLS_ID, SEP_ID, MASK_ID = 3, 4, 5
N_SPECIAL = 6  # ids below this are never drawn as MLM's random replacement tokens

ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "relu")  # models/layers.py:activation_fn
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
    n_heads: int = 0  # 0 -> d_model // 64 (at least 1); d_attn = d_model either way
    rel_buckets: int = for_archs("decoder", default=32)  # T5 relative-position buckets (all layers)
    # distance beyond which relative positions share a bucket
    rel_max_distance: int = for_archs("decoder", default=128)
    dropout: float = 0.0  # dropout rate in every layer (decoder / encoder); 0 off
    # weight of the z-loss log(Z)^2 on the output logits; 0 off
    z_loss: float = read_by("lm", "prefix_lm", default=0.0)
    # parameters stay float32; "bfloat16" computes in bf16
    compute_dtype: str = for_archs("decoder", default="float32")
    remat: str = resumable("none")  # none | full | dots (save matmul outputs, recompute the rest)
    scan_layers: bool = resumable(True)  # False runs a Python loop over layers (tests, debugging)
    # layers per scan iteration; 0: all of them up to 2 layers, else 1
    scan_unroll: int = for_archs("decoder", default=0, may_resume=True)
    # tokens per chunk of the fused output-projection + loss; 0: unfused
    xent_chunk: int = read_by("lm", "prefix_lm", default=2048, may_resume=True)
    # The decoder's training/eval attention (one class each in jaxdepth/attentions.py): einsum
    # (our own, the reference) | dot_product (jax.nn.dot_product_attention,
    # implementation=None: XLA's path in jax 0.10) | cudnn (the same call forcing cuDNN's
    # fused flash kernel: GPU only, bf16 compute).
    attention: str = for_archs("decoder", default="einsum", may_resume=True)
    # decoder | act (ACT encoder) | albert (weight-tied, fixed M) | bert (untied, ALBERT
    # embeddings) | encoder (BERT/RoBERTa of models/encoder.py: MLM pretraining, fusion
    # backbone); one class each in jaxdepth/archs.py
    arch: str = "decoder"

    def __post_init__(self):
        _positive(self, "model", "vocab_size", "d_model", "n_layers", "d_ff",
                  "rel_buckets", "rel_max_distance")
        _require(self.n_heads >= 0, "model.n_heads", f"must be >= 0, got {self.n_heads}")
        _require(self.d_model % self.heads == 0, "model.n_heads",
                 f"d_model={self.d_model} is not divisible by n_heads={self.heads}")
        _require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(self.z_loss >= 0.0, "model.z_loss", f"must be >= 0, got {self.z_loss}")
        _require(self.compute_dtype in ("float32", "bfloat16"), "model.compute_dtype",
                 f"must be float32 or bfloat16, got {self.compute_dtype!r}")
        _require(self.remat in ("none", "full", "dots"), "model.remat",
                 f"must be none, full or dots, got {self.remat!r}")
        _require(self.scan_unroll >= 0, "model.scan_unroll", "must be >= 0")
        _require(self.xent_chunk >= 0, "model.xent_chunk", "must be >= 0")
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


_MLM = ("encoder_pretrain", "encoder_mlm", "mlm")  # the run kinds that make MLM examples
_CORPUS = ("lm", *_MLM)  # the run kinds that train on data.corpus (probe: on the grammar's)


@dataclass(frozen=True)
class DataConfig:
    # "grammar" (embedded) or comma-separated files, directories, globs
    corpus: str = read_by(*_CORPUS, default="grammar")
    # the same for validation; empty -> split off valid_fraction (not streaming)
    valid: str = read_by(*_CORPUS, default="")
    # tokenize and pack on the fly from the files (data/corpus/streaming.py)
    streaming: bool = read_by("lm", default=False)
    # streaming: file streams (fixes the data order; hosts split them)
    streams: int = read_by("lm", default=8)
    # streaming: loader processes per host; 0 = a thread of the trainer
    workers: int = read_by("lm", default=0)
    # On resume, start the data stream afresh at the restored step on the corpus as it is now
    # (e.g. shards appended) instead of refusing a changed corpus; the token-file path
    # re-tokenizes it with the run's tokenizer (data/corpus/streaming.py,
    # data/corpus/prepare.py). Every resume given it restarts.
    restart_stream: bool = read_by("lm", default=False, may_resume=True)
    # streaming: documents the tokenizer is trained on
    tokenizer_sample: int = read_by("lm", default=50_000)
    # documents held out for validation when data.valid is empty
    valid_fraction: float = read_by(*_CORPUS, default=0.05)
    # which documents valid_fraction holds out (any corpus)
    valid_seed: int = read_by(*_CORPUS, default=1234)
    # enough that the default run's 400 steps see each about twice
    grammar_docs: int = read_by(*_CORPUS, "probe", default=20000)
    grammar_seed: int = read_by(*_CORPUS, "probe", default=1234)  # the embedded grammar's documents
    tokenizer: str = ""  # an existing SentencePiece .model; empty -> train one into the run dir
    # The SentencePiece algorithm of a trained tokenizer. unigram is T5's; at a few hundred
    # pieces bpe keeps frequent words and symbols whole (COGS: 56 pieces per example, not 97).
    tokenizer_type: str = "unigram"
    seq_len: int = 128  # tokens per training sequence (window, packed row or encoder input)
    batch_size: int = 32  # global batch, in sequences, per optimizer step
    # encoders (MLM): share of tokens to predict
    mask_rate: float = read_by(*_MLM, default=0.15)
    max_predictions: int = read_by(*_MLM, default=20)  # encoders (MLM): cap per sequence (ALBERT's)
    max_ngram: int = read_by(*_MLM, default=3)  # encoders (MLM): longest masked n-gram of words

    def __post_init__(self):
        _positive(self, "data", "seq_len", "batch_size", "grammar_docs", "max_predictions",
                  "max_ngram")
        _require(0.0 < self.mask_rate <= 1.0, "data.mask_rate", f"must be in (0, 1], got {self.mask_rate}")
        _require(0.0 <= self.valid_fraction < 1.0, "data.valid_fraction",
                 f"must be in [0, 1), got {self.valid_fraction}")
        _require(bool(self.corpus.strip()), "data.corpus", "must be 'grammar' or file paths")
        _positive(self, "data", "streams", "tokenizer_sample")
        _require(self.tokenizer_type in ("unigram", "bpe"), "data.tokenizer_type",
                 f"must be unigram or bpe, got {self.tokenizer_type!r}")
        _require(self.workers >= 0, "data.workers", f"must be >= 0, got {self.workers}")
        if self.streaming:  # the corpus itself is checked where it is read (tasks/lm.py)
            _require(self.batch_size % self.streams == 0, "data.streams",
                     f"{self.streams} streams do not divide data.batch_size={self.batch_size}")


# The optimizer fields a run kind's recipe sets (RunKind.RECIPE, jaxdepth/run_kinds/). Left
# unset (None) in a config, they take the recipe of the run's kind, so a default tuned for
# one kind of run never changes another's; a standalone OptimConfig takes the LM pretraining
# recipe. Of these, OWN_FIELDS are read by some optimizers only (each optimizer's class says
# which, jaxdepth/optimizers/): a recipe gives them per optimizer (its "moments"), the
# optimizer's own DEFAULTS fill those it does not give, and a field the optimizer does not
# read stays None (set, it is refused).
RECIPE_FIELDS = ("name", "lr", "schedule", "warmup_steps", "min_lr_ratio", "weight_decay",
                 "b1", "b2", "eps", "clip_norm")


def _read_by(f: str):
    return lambda: readers(f)


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer. Every field but accum_steps defaults to the run kind's recipe
    (RunKind.RECIPE; None here means "the recipe's"); a value given here is kept whatever the
    kind."""
    # one class each: jaxdepth/optimizers/
    name: str = None
    lr: float = None  # adafactor: relative to each parameter's RMS
    # warmup, then the schedule's decay to lr * min_lr_ratio (one class each: jaxdepth/schedules/)
    schedule: str = None
    warmup_steps: int = None  # steps of linear warmup from 0 to lr
    min_lr_ratio: float = None  # end of linear/cosine decay, as a fraction of lr
    weight_decay: float = None  # decoupled (AdamW/LAMB), never on norm scales and biases
    b1: float = field(default=None, metadata={"read_by": _read_by("b1")})  # first-moment decay
    b2: float = field(default=None, metadata={"read_by": _read_by("b2")})  # second-moment decay
    # added to the root of the second moment
    eps: float = field(default=None, metadata={"read_by": _read_by("eps")})
    clip_norm: float = None  # 0 disables global-norm clipping
    accum_steps: int = 1  # micro-batches per optimizer step
    # The RECIPE_FIELDS that were left unset, filled from a recipe (Config refills them from
    # its run kind's). Not a setting: never saved, not compared.
    from_recipe: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self):
        unset = frozenset(f for f in RECIPE_FIELDS if getattr(self, f) is None)
        recipe = LMPretraining.RECIPE  # a standalone OptimConfig: the default run's
        for f in unset - set(OWN_FIELDS):
            object.__setattr__(self, f, recipe[f])
        opt = optimizer(self.name)  # a ConfigError naming optim.name
        unread = frozenset(OWN_FIELDS) - set(opt.DEFAULTS)
        # A field the optimizer does not read stays None, taken from no recipe; while the
        # optimizer is the recipe's, the run kind's may still change it (with_recipe).
        object.__setattr__(self, "from_recipe", unset if "name" in unset else unset - unread)
        for f in OWN_FIELDS:
            if f in opt.DEFAULTS:
                if f in unset:
                    own = recipe["moments"].get(self.name, {})
                    object.__setattr__(self, f, own.get(f, opt.DEFAULTS[f]))
                continue
            # An optimizer left to the recipe may still become the run kind's (with_recipe),
            # which may read f: only a named optimizer refuses it.
            _require(getattr(self, f) is None or "name" in unset, f"optim.{f}",
                     f"optim.name {self.name} does not read it (read by: "
                     f"{', '.join(readers(f)) or 'none'})")
        sched = schedule_class(self.schedule)  # a ConfigError naming optim.schedule
        _positive(self, "optim", "lr", "accum_steps")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        sched.check(self)
        _require(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio", "must be in [0, 1]")
        _require(self.clip_norm >= 0.0, "optim.clip_norm", "must be >= 0")

    def with_recipe(self, recipe: dict, kind: str,
                    per_trial: frozenset = frozenset()) -> "OptimConfig":
        """These settings, with the fields left unset taken from `recipe` (run kind `kind`'s).
        A recipe's learning rate belongs to its optimizer: naming another optimizer without a
        learning rate is refused rather than run at a rate meant for a different update rule,
        unless every trial gives its own (per_trial: the fields a trials list sets)."""
        if not self.from_recipe:
            return self
        if "lr" in self.from_recipe and "lr" not in per_trial and "name" not in self.from_recipe \
                and self.name != recipe["name"]:
            raise ConfigError(f"optim.lr: the {kind} recipe's learning rate {recipe['lr']} is "
                              f"for {recipe['name']}; with optim.name {self.name} give "
                              f"--optim.lr too", field="optim.lr")
        given = {f: getattr(self, f) for f in RECIPE_FIELDS if f not in self.from_recipe}
        name = given.get("name", recipe["name"])
        reads = optimizer(name).DEFAULTS
        unread = [f for f in OWN_FIELDS if f in given and f not in reads]
        if unread and "name" not in given:  # the user set a moment, not this optimizer
            raise ConfigError(f"optim.{unread[0]}: the {kind} recipe's optimizer {name} does not "
                              f"read it (read by: {', '.join(readers(unread[0])) or 'none'}); "
                              f"name one that does with --optim.name", field=f"optim.{unread[0]}")
        own = recipe["moments"].get(name, {})
        taken = {**{f: own.get(f, default) for f, default in reads.items()},
                 **{f: v for f, v in recipe.items() if f != "moments"}}
        out = OptimConfig(**{**taken, **given, "accum_steps": self.accum_steps})
        object.__setattr__(out, "from_recipe", self.from_recipe)  # the kind may change again
        return out


@dataclass(frozen=True)
class MeshConfig:
    data: int = resumable(-1)  # -1: every device not used by the model axis
    model: int = resumable(1)  # tensor parallelism over heads / MLP / vocab
    fsdp: bool = resumable(False)  # also shard parameters and optimizer state over the data axis
    coordinator: str = resumable("")  # host:port of process 0; set for multi-process runs
    num_processes: int = resumable(1)  # processes (hosts) of a multi-process run
    process_id: int = resumable(0)  # this process's index, 0 .. num_processes - 1

    def __post_init__(self):
        _require(self.data == -1 or self.data > 0, "mesh.data", "must be -1 or positive")
        _positive(self, "mesh", "model", "num_processes")
        _require(0 <= self.process_id < self.num_processes, "mesh.process_id",
                 f"must be in [0, {self.num_processes})")
        _require(self.num_processes == 1 or bool(self.coordinator), "mesh.coordinator",
                 "is required when num_processes > 1")


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
    samples: int = read_by("lm", default=3, may_resume=True)
    sample_tokens: int = read_by("lm", default=24, may_resume=True)  # tokens of each one
    # embedded grammar: sampled continuations scored by its recognizer
    grammar_samples: int = read_by("lm", default=64, may_resume=True)
    progress: bool = resumable(True)  # a progress bar on the terminal
    # >0: exit after this many steps in this invocation (tests, preemption drills)
    stop_after: int = resumable(0)
    # comma-separated run.seed values trained side by side as trials of one compiled program
    # (trainer/trials.py); empty: one run of run.seed
    seeds: str = ""

    def __post_init__(self):
        _positive(self, "run", "steps", "log_every", "eval_every", "save_every", "keep")
        parse_list(self.seeds, int, "run.seeds")
        _require(self.samples >= 0, "run.samples", "must be >= 0")
        _require(self.grammar_samples >= 0, "run.grammar_samples", "must be >= 0")
        _require(self.stop_after >= 0, "run.stop_after", "must be >= 0")


def parse_list(text: str, kind: type, name: str) -> list:
    """The values of a comma-separated list field ("" -> []); ConfigError naming the field."""
    if not text.strip():
        return []
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a comma-separated list of "
                          f"{kind.__name__}s", field=name) from None
    _require(len(set(values)) == len(values), name, f"repeats a value: {text!r}")
    return values


@dataclass(frozen=True)
class TrialsConfig:
    """Values of a setting tried side by side, as trials of one compiled program
    (trainer/trials.py): each field a comma-separated list for the setting it names. The
    trials are the grid product of these lists and run.seeds. Only settings that change no
    array shape can vary between trials. A list gives its setting (a learning rate for an
    optimizer other than the recipe's included); the setting given as well is refused."""
    lr: str = ""  # optim.lr
    weight_decay: str = ""  # optim.weight_decay
    # task.seed (few-shot sample, grammar splits); "seed": each trial's run.seed (a few-shot
    # trial t samples its sentences and initialises with seed t)
    task_seed: str = ""
    n_shot: str = ""  # task.n_shot (ner: the few-shot sample's size)
    dropout: str = ""  # model.dropout (the decoder's)
    act_dropout: str = ""  # act.dropout
    fusion_dropout: str = ""  # fusion.dropout (on h before the NER head)
    tau: str = ""  # act.tau (the ponder-cost weight)
    # How the trials are evaluated (trial_axis.py:Models): vmapped (one program over the
    # trials' stacked models, where they evaluate on the same inputs) | trial_by_trial (each
    # on its slice, sharing the solo programs) | auto: vmapped except on the CPU, where K
    # independent programs overlap and were measured faster (docs/benchmarks.md). The same
    # numbers either way (tests/trainer/test_trials.py).
    evaluation: str = resumable("auto")

    def __post_init__(self):
        _require(self.evaluation in TRIAL_EVALUATIONS, "trials.evaluation",
                 f"must be one of {', '.join(TRIAL_EVALUATIONS)}, got {self.evaluation!r}")
        for name, (_, kind) in TRIAL_FIELDS.items():
            if name == "task_seed" and self.task_seed == FOLLOWS_SEED:
                continue
            values = parse_list(getattr(self, name), kind, f"trials.{name}")
            _require(all(v >= 0 for v in values), f"trials.{name}", "values must be >= 0")
            if name.endswith("dropout"):
                _require(all(v < 1 for v in values), f"trials.{name}", "rates must be below 1")


FOLLOWS_SEED = "seed"  # trials.task_seed: each trial's task.seed is its run.seed
TRIAL_EVALUATIONS = ("auto", "vmapped", "trial_by_trial")  # trials.evaluation

# trials.<name> -> (the setting it varies, its type)
TRIAL_FIELDS = {"lr": ("optim.lr", float), "weight_decay": ("optim.weight_decay", float),
                "task_seed": ("task.seed", int), "n_shot": ("task.n_shot", int),
                "dropout": ("model.dropout", float), "act_dropout": ("act.dropout", float),
                "fusion_dropout": ("fusion.dropout", float), "tau": ("act.tau", float)}



# ---------------------------------------------------------------- settings traced per trial
# Settings a model reads at run time that the trials of one compiled step may vary.
#
# A model's dropout rate and ACT's ponder weight are fields of its static config: one number
# per compiled program. Trials (trainer/trials.py) vary them inside one program, so their step
# sets each varying setting's per-trial value while it traces the update (`trial_values`), and
# a model reads such a setting through `setting`: the trial's traced value inside that trace,
# its own config's float everywhere else (solo runs, evaluation, decoding). A context rather
# than an argument, because the value has to reach every layer's dropout through every task's
# objective and model call, and those signatures should not carry the trials' plumbing.
#
# A traced dropout rate travels as its keep probability (`Keep`), computed on the host in
# float64 as a solo run's Python `1.0 - rate` is, so that a trial draws the solo run's masks
# bit for bit.

# Settings (config "section.field") a model reads through `setting`.
DROPOUT_SETTINGS = ("model.dropout", "act.dropout", "fusion.dropout")
SCALAR_SETTINGS = ("act.tau",)

_VALUES: contextvars.ContextVar[dict] = contextvars.ContextVar("trial_values", default={})


class Keep:
    """A dropout rate traced per trial, held as its keep probability 1 - rate."""

    __slots__ = ("p",)

    def __init__(self, p):  # a traced float32 scalar
        self.p = p


@contextlib.contextmanager
def trial_values(values: dict):
    """Within the block, `setting(name, ...)` gives values[name] (a traced array, or a Keep
    for a dropout rate)."""
    token = _VALUES.set(values)
    try:
        yield
    finally:
        _VALUES.reset(token)


def setting(name: str | None, value: float):
    """The value of setting `name` for the trace in progress: a trial's traced value inside a
    trial step that varies it, else `value` (the model's config)."""
    return value if name is None else _VALUES.get().get(name, value)


def may_drop(rate) -> bool:
    """Whether dropout at `rate` can change anything: a traced rate can (it is 0 in some
    trials only), a float when it is above 0."""
    return isinstance(rate, Keep) or rate > 0.0


def _act_require(cond: bool, name: str, msg: str) -> None:
    _require(cond, f"act.{name}", msg)


@dataclass(frozen=True)
class ACTConfig:
    """The ALBERT-family encoder of model.arch act (adaptive depth, docs/design.md §3),
    albert (the shared layer M times) and bert (M untied layers): its whole description,
    vocabulary included."""
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "embed_dim", "d_model", "n_heads", "d_ff",
                                        "max_len", "n_segments")
    vocab_size: int = 512  # tokenizer pieces = embedding rows
    embed_dim: int = 128  # E, ALBERT's factorised embedding size
    d_model: int = 128  # width of the (shared) layer
    n_heads: int = 2  # attention heads of the layer
    d_ff: int = 0  # 0 -> 4 * d_model
    max_len: int = 128  # positions of the learned position embedding
    n_segments: int = 2  # segment (token type) embeddings: sentences A and B
    max_iters: int = 6  # M: the cap on iterations (ACT), or the depth (fixed, untied)
    tau: float = 1e-3  # ponder-cost weight
    eps: float = 0.01  # a token halts once its cumulative halting probability passes 1 - eps
    dropout: float = 0.0  # dropout rate in the layer and embeddings; 0 off
    # act | fixed: exactly M iterations, no halting (weight-tied ALBERT); one class each in
    # jaxdepth/halting.py
    halting: str = "act"
    # b_h at init: < 0 starts every token at M (act-cpu); tests and benchmarks also move it
    # to force depths
    halting_bias_init: float = 0.0
    remat: bool = False  # recompute the shared layer on the backward pass instead of storing it

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "d_model", "n_heads", "max_len", "n_segments",
                     "max_iters"):
            v = getattr(self, name)
            _act_require(isinstance(v, int) and v > 0, name, f"must be a positive integer, got {v!r}")
        _act_require(self.d_ff >= 0, "d_ff", f"must be >= 0 (0 means 4 * d_model), got {self.d_ff}")
        _act_require(self.d_model % self.n_heads == 0, "n_heads",
                 f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        _act_require(self.tau >= 0.0, "tau", f"must be >= 0, got {self.tau}")
        _act_require(0.0 < self.eps < 1.0, "eps", f"must be in (0, 1), got {self.eps}")
        _act_require(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        halting_class(self.halting)  # a ConfigError naming act.halting

    @property
    def ff(self) -> int:
        return self.d_ff or 4 * self.d_model

    def shape(self) -> dict[str, int]:
        """The SHAPE fields as the model uses them (d_ff=0 is 4 * d_model)."""
        return {f: self.ff if f == "d_ff" else getattr(self, f) for f in self.SHAPE}

    @classmethod
    def preset(cls, name: str, **overrides) -> "ACTConfig":
        _act_require(name in ACT_PRESETS, "preset", f"unknown preset {name!r}; known: {sorted(ACT_PRESETS)}")
        return cls(**{**ACT_PRESETS[name], **overrides})


# (tau, M) are the paper's; sizes are small enough for a CPU except base (ALBERT-base width).
ACT_PRESETS: dict[str, dict] = {
    "tiny": dict(tau=1e-3, max_iters=6, d_model=128, n_heads=2),
    "small": dict(tau=5e-4, max_iters=12, d_model=256, n_heads=4),
    "base": dict(tau=2.5e-4, max_iters=24, d_model=768, n_heads=12),
}


# The run kinds that start from a pretrained run (task.init_from): fine-tuning and fusion
_FROM_PRETRAINED = ("prefix_lm", "probe", "ner", "mlm")


@dataclass(frozen=True)
class TaskConfig:
    """Fine-tuning as a prefix LM (empty name: language-model pretraining).

    With `dir` empty the task comes from the embedded grammar (semantic_parsing or
    passivization); with `dir` set it is read in its published format from there (cogs,
    cogs_vf, geoquery, passivization).
    """
    name: str = ""  # the task trained on (see the class docstring); empty: LM pretraining
    # directory of a published task's files; empty: the embedded grammar's task
    dir: str = read_by("prefix_lm", "ner", default="")
    # run directory of a pretrained model; empty: fresh weights
    init_from: str = read_by(*_FROM_PRETRAINED, default="")
    # checkpoint of init_from to start from; 0: its latest
    init_step: int = read_by(*_FROM_PRETRAINED, default=0)
    n_train: int = read_by("prefix_lm", "probe", default=2000)  # embedded grammar: training examples
    # embedded grammar: dev/test size, and examples per generalization type
    n_eval: int = read_by("prefix_lm", "probe", default=200)
    # embedded grammar splits; GeoQuery's held-out dev; periodic eval subsets; NER's sample
    seed: int = read_by("prefix_lm", "probe", "ner", default=0)
    # GeoQuery (no dev split): share of train held out as dev
    dev_fraction: float = read_by("prefix_lm", default=0.1)
    # comma-separated; empty: dev + the task's generalization splits
    eval_splits: str = read_by("prefix_lm", default="", may_resume=True)
    # evaluations in training score at most this many examples per split
    eval_max: int = read_by("prefix_lm", "ner", default=0, may_resume=True)
    # sequences per decoding batch; 0: data.batch_size
    eval_batch: int = read_by("prefix_lm", "probe", "ner", default=0, may_resume=True)
    # cut over-long examples (seqio style) instead of refusing them
    truncate: bool = read_by("prefix_lm", default=False)
    # Training rows hold several examples, attention kept inside each (seqio pack=True): the
    # same loss per example, several times the examples per step on short tasks. Dev loss
    # and decoding stay one example per row.
    pack: bool = read_by("prefix_lm", default=False)
    # ner: train on N * C sentences drawn with task.seed (C entity types); 0: all
    n_shot: int = read_by("ner", default=0)

    def __post_init__(self):
        names = TASKS + PROBE_TASKS + FUSION_TASKS
        _require(self.name in ("",) + names, "task.name",
                 f"must be empty (pretraining) or one of {', '.join(names)}; got {self.name!r}")
        _require(self.n_shot >= 0, "task.n_shot", f"must be >= 0, got {self.n_shot}")
        _require(not self.name or bool(self.dir) or self.name in GRAMMAR_TASKS + PROBE_TASKS + ("mlm",),
                 "task.dir",
                 f"task {self.name!r} is read from its published files: set task.dir (the "
                 f"embedded grammar provides only {', '.join(GRAMMAR_TASKS)})")
        _require(self.init_step >= 0, "task.init_step", "must be >= 0")
        _positive(self, "task", "n_train", "n_eval")
        _require(0.0 < self.dev_fraction < 1.0, "task.dev_fraction", "must be in (0, 1)")
        _require(self.eval_max >= 0, "task.eval_max", f"must be >= 0, got {self.eval_max}")
        _require(self.eval_batch >= 0, "task.eval_batch", f"must be >= 0, got {self.eval_batch}")

    @property
    def grammar(self) -> bool:
        return not self.dir


@dataclass(frozen=True)
class FusionConfig:
    """What sits between the backbone and the head of a fusion task (task.name ner or mlm).

    The backbone is task.init_from: a Hugging Face BERT/RoBERTa directory, or a run of this
    project (encoder, act/albert/bert, or decoder); empty: a fresh model.arch backbone."""
    KINDS: ClassVar[tuple[str, ...]] = FUSION_TASKS  # the run kinds that read this section
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
        _require(self.cache_mib >= 0, "fusion.cache_mib", f"must be >= 0, got {self.cache_mib}")
        _require(self.extra_layers > 0, "fusion.extra_layers", f"must be positive, got {self.extra_layers}")
        fusion_mode(self.mode)  # a ConfigError naming fusion.mode
        _require(0.0 <= self.dropout < 1.0, "fusion.dropout", f"must be in [0, 1), got {self.dropout}")


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
    # task.init_from) are upgraded on reading (Config.from_dict, upgrade).
    version: int = 4

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
        read_for = {f.name: f.metadata["archs"] for f in dataclasses.fields(ModelConfig)
                    if "archs" in f.metadata}
        for name in self.changed("model"):
            if name in read_for and self.model.arch not in read_for[name]:
                raise ConfigError(f"model.{name}: model.arch={self.model.arch!r} does not read "
                                  f"it (read for model.arch {', '.join(read_for[name])})",
                                  field=f"model.{name}")
        # Which sections must agree for a given model.arch and task.name is decided by
        # run_kinds.kind_of, the one place that dispatches on them.
        _require(self.data.batch_size % self.optim.accum_steps == 0, "optim.accum_steps",
                 f"must divide data.batch_size={self.data.batch_size}")
        # Each architecture names the setting its model reads per trial as its dropout rate
        # (Arch.TRIAL_DROPOUT; an encoder's comes from its checkpoint as often as not).
        varied, own = TRIAL_FIELDS["dropout"][0], self.arch.TRIAL_DROPOUT
        other = [f"trials.{n} varies {s}" for n, (s, _) in TRIAL_FIELDS.items() if s == own]
        _require(not self.trials.dropout or own == varied, "trials.dropout",
                 f"varies the decoder's {varied}; model.arch={self.model.arch!r} does not "
                 f"read it per trial" + "".join(f" ({o})" for o in other))
        if self.optim.from_recipe:
            try:
                kind = kind_of(self)
            except ConfigError:  # no task runs this config: kind_of says why where it is asked
                kind = None
            if kind is not None:
                object.__setattr__(self, "optim", self.optim.with_recipe(
                    kind.recipe(self), kind.NAME, _optim_per_trial(self)))

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
    def vocab_size(self) -> int:
        """The model's vocabulary, which the run's tokenizer must match."""
        return getattr(self, self.model_section).vocab_size

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

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A Config from nested dicts (a JSON config file), every value type-checked."""
        _require(isinstance(d, dict), "config",
                 f"must be a JSON object of sections, got {json.dumps(d)}")
        d = upgrade(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        _require(not unknown, "config", f"unknown sections {sorted(unknown)}")
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            if f.name in ("preset", "version"):
                kw[f.name] = _typed(f.name, f.type, d[f.name])
                continue
            sec_cls, values = SECTIONS[f.name], d[f.name]
            _require(isinstance(values, dict), f.name,
                     f"must be a JSON object of fields, got {json.dumps(values)}")
            types = {g.name: g.type if isinstance(g.type, str) else g.type.__name__
                     for g in dataclasses.fields(sec_cls) if g.init}
            bad = set(values) - set(types)
            _require(not bad, f.name, f"unknown fields {sorted(bad)}")
            # null: an optimizer field left to the run kind's recipe
            kw[f.name] = sec_cls(**{k: v if v is None and f.name == "optim" and k in
                                    RECIPE_FIELDS else _typed(f"{f.name}.{k}", types[k], v)
                                    for k, v in values.items()})
        return cls(**kw)


def upgrade(d: dict) -> dict:
    """A config dict of an older layout in today's (version 4); others unchanged.

    Version 1 described act/albert/bert models in the act section but took their vocabulary
    from model.vocab_size, and wrote every section whatever the architecture: the section
    that did not describe the model held values the run never read, and they are dropped.
    Versions 1 and 2 saved optim.b1, b2 and eps whatever the optimizer; those its optimizer
    does not read (which today's config refuses) are dropped. Versions 1-3 accepted the
    decoder's own model fields for model.arch encoder, and model/act fields for a fusion run
    over task.init_from (whose backbone is the source's); never read, they are dropped."""
    version = d.get("version", 1)
    _require(version in (1, 2, 3, 4), "version",
             f"must be 1, 2, 3 or 4, got {json.dumps(version)}")
    if version == 4:
        return d
    d = _upgrade_model_sections(d) if version == 1 else d
    optim = d.get("optim")
    if version < 3 and isinstance(optim, dict) and optim.get("name") in optimizer_names():
        reads = optimizer(optim["name"]).DEFAULTS
        d = {**d, "optim": {k: v for k, v in optim.items() if k in reads or k not in OWN_FIELDS}}
    return {**_drop_unread_model_fields(d), "version": 4}


def _drop_unread_model_fields(d: dict) -> dict:
    model, task = d.get("model"), d.get("task", {})
    if not isinstance(model, dict) or not isinstance(task, dict):
        return d  # from_dict names whatever is malformed
    arch = model.get("arch", ModelConfig.arch)
    if task.get("init_from") and task.get("name") in FUSION_TASKS:
        return {**d, "model": {k: v for k, v in model.items() if k == "arch"}, "act": {}}
    unread = {f.name for f in dataclasses.fields(ModelConfig)
              if arch not in f.metadata.get("archs", (arch,))}
    return {**d, "model": {k: v for k, v in model.items() if k not in unread}}


def _upgrade_model_sections(d: dict) -> dict:
    model = d.get("model")
    if not isinstance(model, dict) or not isinstance(d.get("act", {}), dict):
        return d  # from_dict names whatever is malformed
    arch = model.get("arch", ModelConfig.arch)
    if arch in arch_names() and arch_class(arch).SECTION == "act":
        act = {**d.get("act", {})}
        if "vocab_size" in model:
            act["vocab_size"] = model["vocab_size"]
        return {**d, "model": {"arch": arch}, "act": act}
    return {**d, "act": {}}


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
            "mesh": MeshConfig, "run": RunConfig, "task": TaskConfig, "act": ACTConfig,
            "fusion": FusionConfig, "trials": TrialsConfig}


def recipe_lines(cfg: Config) -> list[str]:
    """What the run kind's recipe set (printed at start-up): nothing when the config set every
    optimizer field itself."""
    # Not the recipe's: None (a field its optimizer does not read), or a field a trials list
    # sets, which every trial runs at a value of its own.
    taken = [f for f in RECIPE_FIELDS if f in cfg.optim.from_recipe
             and getattr(cfg.optim, f) is not None and f not in _optim_per_trial(cfg)]
    if not taken:
        return []
    values = ", ".join(f"{f}={getattr(cfg.optim, f)}" for f in taken)
    return [f"recipe of run kind {kind_of(cfg).NAME}: optim: {values}"]


# ----------------------------------------------------------------------------- model specs
# Not command-line sections: what the model and data modules are built from. The tasks derive
# them from the sections above (tasks/mlm.py:bert_config, tasks/encoder_pretrain.py:mlm_config),
# and models/hf_import.py reads an EncoderConfig from a Hugging Face config.json.

@dataclass(frozen=True)
class EncoderConfig:
    """The BERT/RoBERTa encoder of models/encoder.py (model.arch=encoder, or a Hugging Face
    checkpoint)."""
    # Fields that fix parameter shapes; every other field is a run-time option or read from a
    # checkpoint's config.
    SHAPE: ClassVar[tuple[str, ...]] = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff",
                                        "max_positions", "type_vocab_size")
    vocab_size: int = 30522
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_offset: int = 0  # RoBERTa: pad_id + 1 (= 2); BERT: 0
    pad_id: int = 0
    dropout: float = 0.1
    activation: str = "gelu"  # exact erf GELU (HF "gelu"); "gelu_new"/"gelu_tanh": tanh approx
    scan_layers: bool = True  # run-time option: lax.scan over the stacked layers, or unrolled
    remat: bool = False  # run-time option: rematerialise each layer in the backward pass

    def __post_init__(self):
        for name in self.SHAPE:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"EncoderConfig.{name} must be a positive int, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"EncoderConfig.d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"EncoderConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not isinstance(self.position_offset, int) or self.position_offset < 0:
            raise ValueError(f"EncoderConfig.position_offset must be an int >= 0, "
                             f"got {self.position_offset!r}")
        if self.position_offset >= self.max_positions:
            raise ValueError(f"EncoderConfig.position_offset={self.position_offset} leaves no "
                             f"positions (max_positions={self.max_positions})")
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"EncoderConfig.pad_id must be in [0, vocab_size), got {self.pad_id!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"EncoderConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"EncoderConfig.activation must be one of {ACTIVATIONS}, "
                             f"got {self.activation!r}")

    @property
    def max_len(self) -> int:
        """Longest sequence the position table allows."""
        return self.max_positions - self.position_offset

    def shape(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.SHAPE}

    def replace(self, **changes) -> "EncoderConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class MLMConfig:
    """How data/corpus/mlm_sop.py makes ALBERT-style MLM + SOP examples."""
    seq_len: int = 128
    mask_rate: float = 0.15
    max_predictions: int = 20
    max_ngram: int = 3
    p_mask: float = 0.8
    p_random: float = 0.1  # the rest (1 - p_mask - p_random) is kept
    short_seq_prob: float = 0.1
    sop: bool = True
    # The tokenizer's special ids and the first id drawn as a random replacement (defaults:
    # this project's SentencePiece layout; a Hugging Face WordPiece/BPE vocabulary differs).
    cls_id: int = CLS_ID
    sep_id: int = SEP_ID
    mask_id: int = MASK_ID
    first_random_id: int = N_SPECIAL

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"MLMConfig.{field}={getattr(self, field)!r}: {why}")

        for f in ("seq_len", "max_predictions", "max_ngram"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                bad(f, "must be an integer")
        for f in ("mask_rate", "p_mask", "p_random", "short_seq_prob"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) \
                    or not np.isfinite(v):
                bad(f, "must be a finite number")
        if not isinstance(self.sop, (bool, np.bool_)):
            bad("sop", "must be a bool")
        if self.seq_len < 5:
            bad("seq_len", "must be >= 5 ([CLS] A [SEP] B [SEP] with non-empty A and B)")
        if not 0 < self.mask_rate <= 1:
            bad("mask_rate", "must be in (0, 1]")
        if self.max_predictions < 1:
            bad("max_predictions", "must be >= 1")
        if self.max_ngram < 1:
            bad("max_ngram", "must be >= 1")
        if not 0 <= self.p_mask <= 1:
            bad("p_mask", "must be in [0, 1]")
        if not 0 <= self.p_random <= 1:
            bad("p_random", "must be in [0, 1]")
        if self.p_mask + self.p_random > 1 + 1e-12:
            bad("p_random", f"p_mask + p_random = {self.p_mask + self.p_random} exceeds 1")
        if not 0 <= self.short_seq_prob <= 1:
            bad("short_seq_prob", "must be in [0, 1]")
        for f in ("cls_id", "sep_id", "mask_id", "first_random_id"):
            if not isinstance(getattr(self, f), (int, np.integer)) or getattr(self, f) < 0:
                bad(f, "must be an integer >= 0")


def apply_overrides(cfg: Config, overrides: dict[str, dict]) -> Config:
    """A new Config with nested overrides applied (validated again)."""
    d = cfg.to_dict(keep_recipe=True)
    for sec, vals in overrides.items():
        if sec in ("preset", "version"):
            d[sec] = vals
            continue
        _require(sec in SECTIONS, "config", f"unknown section {sec!r}")
        d[sec] = {**d.get(sec, {}), **vals}
    return Config.from_dict(d)


# In task.init_from or data.tokenizer: replaced by each trial's run.seed (a solo run's own), so
# that trial k starts from the pretraining run of its own seed (runs/pre-s{seed}), and a trial's
# config run solo is that trial.
SEED_FIELD = "{seed}"


def trial_grid(cfg: Config) -> list[dict]:
    """The trials of cfg, each as {setting: value} over the settings that vary: the grid
    product of the trials section's lists (in TRIAL_FIELDS order) and run.seeds, the seed
    varying fastest (so each setting's seeds are neighbours). [] for a run without trials."""
    axes = [(TRIAL_FIELDS[n][0], parse_list(getattr(cfg.trials, n), TRIAL_FIELDS[n][1],
                                            f"trials.{n}"))
            for n in TRIAL_FIELDS if getattr(cfg.trials, n)
            and not (n == "task_seed" and cfg.trials.task_seed == FOLLOWS_SEED)]
    seeds = parse_list(cfg.run.seeds, int, "run.seeds")
    if not axes and not seeds:
        return []
    axes.append(("run.seed", seeds or [cfg.run.seed]))
    grid = [dict(zip([f for f, _ in axes], combo))
            for combo in itertools.product(*[values for _, values in axes])]
    if cfg.trials.task_seed == FOLLOWS_SEED:
        grid = [{**t, "task.seed": t["run.seed"]} for t in grid]
    return grid


def per_trial(cfg: Config) -> dict[str, str]:
    """The settings (``section.field``) that each trial of cfg sets for itself, each to the list
    that sets it (``{"optim.lr": "trials.lr", "run.seed": "run.seeds"}``): the value cfg holds
    for such a setting is no trial's. {} for a run without trials."""
    grid = trial_grid(cfg)
    if not grid:
        return {}
    lists = {**{f: f"trials.{n}" for n, (f, _) in TRIAL_FIELDS.items()}, "run.seed": "run.seeds"}
    # without run.seeds every trial keeps cfg's run.seed
    return {s: lists[s] for s in grid[0] if s != "run.seed" or cfg.run.seeds.strip()}


def _optim_per_trial(cfg: Config) -> frozenset[str]:
    return frozenset(s.split(".")[1] for s in per_trial(cfg) if s.startswith("optim."))


def trial_configs(cfg: Config) -> list[Config]:
    """One Config per trial of cfg (trial_grid): cfg with that trial's settings, as the solo
    run it equals. [cfg] for a run without trials ({seed} replaced by its run.seed); a
    one-trial grid is that solo run."""
    overrides = []
    for trial in trial_grid(cfg) or [{}]:
        o: dict[str, dict] = {"run": {"seeds": ""}, "trials": {n: "" for n in TRIAL_FIELDS}}
        for setting, value in trial.items():
            sec, name = setting.split(".")
            o.setdefault(sec, {})[name] = value
        seed = str(trial.get("run.seed", cfg.run.seed))
        for sec, name in (("task", "init_from"), ("data", "tokenizer")):
            value = getattr(getattr(cfg, sec), name)
            if SEED_FIELD in value:  # each trial starts from the run of its own seed
                o.setdefault(sec, {})[name] = value.replace(SEED_FIELD, seed)
        overrides.append(o)
    if len(overrides) == 1 and not trial_grid(cfg):  # a solo run: {seed} is its run.seed
        seeded = {sec: v for sec, v in overrides[0].items() if sec in ("task", "data")}
        return [apply_overrides(cfg, seeded) if seeded else cfg]
    return [apply_overrides(cfg, o) for o in overrides]
