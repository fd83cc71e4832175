"""Every ``python train.py`` command (or ``python -m jaxdepth.train``, ``jaxdepth-train``, each
maybe under ``srun``) of README.md and docs/*.md is parsed, and run for a few
steps where a CPU can (issue 23): a default change that breaks a documented command, or gives
it another optimizer recipe than a reader of the README expects, fails here.

- The commands are extracted from fenced code blocks (with their ``\\`` continuation lines,
  an ``&&`` or ``VAR=value`` before them, and shell comments dropped) and from inline code
  spans; a ``...`` standing for "the rest of your command" is dropped. Test ids are
  ``file:line``.
- EXPECTED holds, for each command as written, the run kind and the optimizer (name, lr,
  schedule) a reader of the README expects it to train with. A new command without an entry
  fails until one is added.
- Every command is parsed with jaxdepth.config.cli.parse_args (``--config runs/X/config.json``: the
  config.json that the command making runs/X writes), and the recipe checked, with the kind
  train.py's start-up line names.
- The CPU-feasible ones are then run in-process through train.py's own body for 2 steps, with
  overrides that only shorten them (SHORTEN) and their placeholder paths (data/cogs,
  my_corpus.txt, runs/default, ...) replaced by real small fixtures: the shared data directory
  (``shared_data``: skipped without it), files generated under a temporary directory, runs
  made by earlier commands of the same documents (``runs/default``, ``runs/act-tiny``,
  ``runs/bert-mini``: each made once per module), and all-MiniLM-L6-v2 (the ``minilm_dir``
  fixture) for a Hugging Face backbone (skipped when it cannot be had). The run must finish
  with a finite train loss in summary.json, and its saved config.json hold the expected
  recipe. NOT_RUN says why a command is only parsed (paper scale, several hosts, 8-device
  meshes); FULL_ONLY lists those that run only with ``JAXDEPTH_README_ALL=1`` (CI's time).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import random
import re
import shlex
import string
from dataclasses import dataclass
from pathlib import Path

import pytest

from jaxdepth.config.cli import parse_args, preset_lines
from jaxdepth.experiments.experiment import shared_compilations
from jaxdepth.config.run_kinds import kind_of

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))


# ----------------------------------------------------------------------------- extraction

_FENCE = re.compile(r"^\s*(```|~~~)")
_ENV = r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
# A launcher that starts the command on every node (srun and its options), then one of the
# three forms of the training command.
_LAUNCH = r"(?:srun(?:\s+(?:-[\w-]+(?:=\S+)?|\d+))*\s+)?"  # options, numbers their values
_TRAIN = r"(?:python3? train\.py|python3? -m jaxdepth\.train|jaxdepth-train)"
# In a code block: a command at the start of a line or after && / ; (not inside a comment).
_BLOCK_CMD = re.compile(rf"(?:^\s*|&&\s*|;\s*)({_ENV}{_LAUNCH}{_TRAIN}(?:\s.*)?)$")
_INLINE_CMD = re.compile(rf"`({_ENV}{_LAUNCH}{_TRAIN}(?:\s[^`]*)?)`")


@dataclass(frozen=True)
class Command:
    where: str  # file:line of its first line
    env: tuple[str, ...]  # VAR=value before it
    argv: tuple[str, ...]  # the arguments after train.py, as written ("..." dropped)
    launcher: tuple[str, ...] = ()  # srun and its options, when a scheduler starts it

    @property
    def key(self) -> str:
        """The command as written, normalised: EXPECTED's and NOT_RUN's key."""
        return " ".join(self.argv)

    @classmethod
    def parse(cls, where: str, text: str) -> "Command":
        words = shlex.split(text, comments=True)
        env = []
        while "=" in words[0] and not words[0].startswith("python"):
            env.append(words.pop(0))
        launcher = []
        if words[0] == "srun":
            while words[0] == "srun" or words[0].startswith("-") or words[0].isdigit():
                launcher.append(words.pop(0))
        n = next((len(form) for form in _FORMS if words[:len(form)] == form), None)
        assert n is not None, (where, text)
        return cls(where, tuple(env), tuple(w for w in words[n:] if w != "..."), tuple(launcher))


_FORMS = [[py, *rest] for py in ("python", "python3")
          for rest in (["train.py"], ["-m", "jaxdepth.train"])] + [["jaxdepth-train"]]


def _fenced(lines: list[str], rel: str, pattern: re.Pattern):
    """(file:line, text) of each command `pattern` finds in the code blocks of `lines`, with
    its continuation lines joined."""
    fenced, i = False, 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            fenced = not fenced
        elif fenced and (m := pattern.search(line)):
            start, text = i, m.group(1)
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            yield f"{rel}:{start + 1}", text
        i += 1


def extract(rel: str, root: Path = REPO) -> list[Command]:
    """The train.py commands of one Markdown file, in document order."""
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    out = [(int(w.rsplit(":", 1)[1]), Command.parse(w, t))
           for w, t in _fenced(lines, rel, _BLOCK_CMD)]
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += [(i + 1, Command.parse(f"{rel}:{i + 1}", m.group(1)))
                    for m in _INLINE_CMD.finditer(line)]
    return [c for _, c in sorted(out, key=lambda x: x[0])]


# The experiments' commands (depth_sweep, fusion_fewshot; maybe under srun), in code blocks:
# parsed by the experiment's own parser, the plan built and the executor's flags checked, as
# the command does before it writes anything.
_EXPERIMENTS = ("depth_sweep", "fusion_fewshot")
_EXP_CMD = re.compile(rf"(?:^\s*|&&\s*|;\s*)({_ENV}{_LAUNCH}python3? -m "
                      rf"jaxdepth\.experiments\.(?:{'|'.join(_EXPERIMENTS)})(?:\s.*)?)$")


def extract_experiments(rel: str, root: Path = REPO) -> list[tuple[str, str, list[str]]]:
    """(file:line, experiment, arguments) of each experiment command of one Markdown file."""
    out = []
    for where, text in _fenced((root / rel).read_text(encoding="utf-8").splitlines(), rel,
                               _EXP_CMD):
        words = shlex.split(text, comments=True)
        words = words[words.index("-m") + 1:]
        out.append((where, words[0].rsplit(".", 1)[1], [w for w in words[1:] if w != "..."]))
    return out


COMMANDS = [c for rel in DOCUMENTS for c in extract(rel)]
EXPERIMENT_COMMANDS = [c for rel in DOCUMENTS for c in extract_experiments(rel)]


# ----------------------------------------------------------------------------- expectations

ADAFACTOR_LM = ("lm", "adafactor", 6e-2, "cosine")  # the default run's recipe (README)
LAMB = ("encoder_pretrain", "lamb", 1.76e-3, "linear")  # Simoulin & Crabbe's (ALBERT's)
PAPER = ("lm", "adafactor", 1.0, "rsqrt")  # the 134M-L* presets: t5x's pretraining

# command as written -> (run kind, optim.name, optim.lr, optim.schedule); None: --help
EXPECTED: dict[str, tuple | None] = {
    "": ADAFACTOR_LM,
    "--help": None,
    "--preset small-L8 --run.dir runs/small-L8": ADAFACTOR_LM,
    "--model.n_layers 6 --model.d_ff 284 --optim.lr 1e-3": ("lm", "adafactor", 1e-3, "cosine"),
    # a saved config holds the recipe's values: the default run's
    "--config runs/default/config.json --run.steps 600": ADAFACTOR_LM,
    "--data.corpus my_corpus.txt --data.valid my_valid.txt --model.vocab_size 8000 "
    "--data.seq_len 512 --run.dir runs/mine": ADAFACTOR_LM,
    "--data.corpus shard0.jsonl,shard1.jsonl.gz --data.valid_fraction 0.01": ADAFACTOR_LM,
    "--data.tokenizer spm.model": ADAFACTOR_LM,
    "--preset 134M-L12 --run.dir runs/134M-L12 --data.corpus c4/en/c4-train.*-of-01024.json.gz "
    "--data.valid c4/en/c4-validation.*-of-00008.json.gz --run.eval_batches 20 "
    "--model.vocab_size 32128 --data.tokenizer_sample 200000": PAPER,
    "--preset 134M-L12 --mesh.num_processes auto": PAPER,
    "--mesh.num_processes auto --run.dir /shared/runs/a": ADAFACTOR_LM,
    "--preset 134M-L12 --mesh.num_processes auto --run.dir /shared/runs/134M-L12": PAPER,
    "--preset 134M-L12 --mesh.num_processes auto --run.dir /mnt/shared/runs/134M-L12": PAPER,
    "--mesh.data 4 --mesh.model 2": ADAFACTOR_LM,
    "--mesh.data 8 --mesh.fsdp true": ADAFACTOR_LM,
    "--mesh.coordinator host0:1234 --mesh.num_processes 2 --mesh.process_id 0": ADAFACTOR_LM,
    "--mesh.coordinator host0:1234 --mesh.num_processes 2 --mesh.process_id 1": ADAFACTOR_LM,
    # the finetune preset's constant schedule, with the optimizer and lr the command names
    "--preset small-L4+finetune --run.dir runs/ft-sp --task.name semantic_parsing "
    "--task.init_from runs/default --run.steps 1000 --data.batch_size 32 --optim.name adamw "
    "--optim.lr 3e-3": ("prefix_lm", "adamw", 3e-3, "constant"),
    "--preset 134M-L12+finetune --task.name cogs --task.dir data/cogs --task.init_from "
    "runs/134M-L12 --run.dir runs/134M-L12-cogs": ("prefix_lm", "adafactor", 1e-3, "constant"),
    "--preset cogs-cpu --task.name cogs --task.dir data/cogs --run.dir runs/cogs-cpu":
        ("prefix_lm", "adafactor", 0.05, "cosine"),
    "--preset act-tiny --run.dir runs/act-tiny": LAMB,
    "--preset albert-tiny --run.dir runs/albert-tiny": LAMB,
    "--preset bert-tiny --run.dir runs/bert-tiny": LAMB,
    "--config runs/act-tiny/config.json --run.dir runs/act-tiny-roles --task.name roles "
    "--task.init_from runs/act-tiny": ("probe", "lamb", 1.76e-3, "linear"),
    "--preset act-cpu --run.dir runs/act-cpu": LAMB,
    "--preset albert-tiny --act.max_iters 2 --run.steps 1500 --run.dir runs/albert-m2": LAMB,
    "--run.seeds 0,1,2,3,4 --run.dir runs/seeds": ADAFACTOR_LM,
    "--run.seeds 0,1 --trials.lr 0.03,0.1 --run.dir runs/lr": ADAFACTOR_LM,
    "--preset act-cpu --trials.tau 0,1e-4,5e-4 --run.dir runs/act-tau": LAMB,
    "--preset act-cpu --run.seeds 0-4 --run.dir runs/act-cpu-5": LAMB,
    "--model.arch encoder --optim.lr 1e-3 --run.dir runs/bert-mini":
        ("encoder_mlm", "adamw", 1e-3, "linear"),
    # fusion over a frozen backbone (fe): AdamW at 1e-3, linear decay to 0
    "--task.name ner --task.dir data/wikiann/en --task.init_from runs/bert-mini --fusion.method "
    "dwatt --fusion.mode fe --task.n_shot 32 --run.dir runs/ner-dwatt-fe":
        ("ner", "adamw", 1e-3, "linear"),
    "--task.name mlm --task.init_from runs/bert-mini --fusion.method concat --run.dir "
    "runs/mlm-concat": ("mlm", "adamw", 1e-3, "linear"),
    # fine-tuning the whole backbone (ft): the DWAtt paper's 5e-5
    "--task.name ner --task.dir data/wikiann/en --task.init_from path/to/hf-bert --fusion.method "
    "dwatt --fusion.mode ft --data.batch_size 16 --optim.lr 5e-5 --optim.schedule linear "
    "--optim.min_lr_ratio 0 --optim.warmup_steps 0 --run.dir runs/ner-hf":
        ("ner", "adamw", 5e-5, "linear"),
}

_MESH = "an 8-device mesh: tests/trainer/test_training.py runs sharded steps; here it would only compile"
_HOSTS = ("several processes with a coordinator: tests/trainer/test_training.py's and "
          "tests/trainer/test_processes.py's multiprocess tests")
_PAPER = "paper scale: 134M parameters, context 1024, batch 128, C4 streamed on several hosts"
_TRIALS = ("trials of the default run: tests/trainer/test_trials.py runs trials against their solo "
           "runs (a run with trials has a summary of another form)")
NOT_RUN: dict[str, str] = {
    "--help": "prints the fields and exits: parsed only (checked to exit 0)",
    "--preset 134M-L12 --run.dir runs/134M-L12 --data.corpus c4/en/c4-train.*-of-01024.json.gz "
    "--data.valid c4/en/c4-validation.*-of-00008.json.gz --run.eval_batches 20 "
    "--model.vocab_size 32128 --data.tokenizer_sample 200000": _PAPER,
    "--preset 134M-L12 --mesh.num_processes auto": _PAPER + "; " + _HOSTS,
    "--mesh.num_processes auto --run.dir /shared/runs/a": _HOSTS,
    "--preset 134M-L12 --mesh.num_processes auto --run.dir /shared/runs/134M-L12":
        _PAPER + "; " + _HOSTS,
    "--preset 134M-L12 --mesh.num_processes auto --run.dir /mnt/shared/runs/134M-L12":
        _PAPER + "; " + _HOSTS,
    "--mesh.data 4 --mesh.model 2": _MESH,
    "--mesh.data 8 --mesh.fsdp true": _MESH,
    "--mesh.coordinator host0:1234 --mesh.num_processes 2 --mesh.process_id 0": _HOSTS,
    "--mesh.coordinator host0:1234 --mesh.num_processes 2 --mesh.process_id 1": _HOSTS,
    "--preset 134M-L12+finetune --task.name cogs --task.dir data/cogs --task.init_from "
    "runs/134M-L12 --run.dir runs/134M-L12-cogs": _PAPER + " (fine-tunes runs/134M-L12)",
    "--run.seeds 0,1,2,3,4 --run.dir runs/seeds": _TRIALS,
    "--run.seeds 0,1 --trials.lr 0.03,0.1 --run.dir runs/lr": _TRIALS,
    "--preset act-cpu --trials.tau 0,1e-4,5e-4 --run.dir runs/act-tau":
        _TRIALS.replace("of the default run", "of ACT's ponder weight"),
    "--preset act-cpu --run.seeds 0-4 --run.dir runs/act-cpu-5":
        _TRIALS.replace("of the default run", "of ACT's seeds"),
}

# Run only with JAXDEPTH_README_ALL=1: CPU-feasible, but past this file's share of CI's time on
# two cores (about 150 s). Those that always run cover every pipeline these share: the LM
# (default run, saved config, JSONL shards, an existing tokenizer), prefix-LM fine-tuning, ACT
# pretraining, BERT MLM pretraining and fusion NER. Seconds: with SHORTEN, one core of a
# loaded 2-core machine.
ALL = bool(os.environ.get("JAXDEPTH_README_ALL"))
_DEPTH = "the default run's pipeline at another depth (a new compile, ~30 s)"
_ENCODER = "act-tiny's pipeline (encoder_pretrain) with another encoder (a new compile, ~30 s)"
FULL_ONLY: dict[str, str] = {
    "--preset small-L8 --run.dir runs/small-L8": _DEPTH,
    "--model.n_layers 6 --model.d_ff 284 --optim.lr 1e-3": _DEPTH,
    "--data.corpus my_corpus.txt --data.valid my_valid.txt --model.vocab_size 8000 "
    "--data.seq_len 512 --run.dir runs/mine": "trains an 8000-piece tokenizer and compiles a "
    "512-token model; the JSONL-shard command runs the corpus-file path",
    "--preset cogs-cpu --task.name cogs --task.dir data/cogs --run.dir runs/cogs-cpu":
        "tokenizes and packs all of real COGS and trains its BPE tokenizer on it (minutes); "
        "the semantic-parsing command runs prefix-LM fine-tuning",
    "--preset albert-tiny --run.dir runs/albert-tiny": _ENCODER,
    "--preset bert-tiny --run.dir runs/bert-tiny": _ENCODER,
    "--preset act-cpu --run.dir runs/act-cpu": _ENCODER,
    "--preset albert-tiny --act.max_iters 2 --run.steps 1500 --run.dir runs/albert-m2": _ENCODER,
    "--config runs/act-tiny/config.json --run.dir runs/act-tiny-roles --task.name roles "
    "--task.init_from runs/act-tiny": "probing from runs/act-tiny (a new compile, ~30 s); "
    "tests/tasks/test_probing.py runs probing tasks",
    "--task.name mlm --task.init_from runs/bert-mini --fusion.method concat --run.dir "
    "runs/mlm-concat": "fusion MLM over runs/bert-mini (a new compile, ~14 s); the NER command "
    "runs fusion over the same backbone",
    "--task.name ner --task.dir data/wikiann/en --task.init_from path/to/hf-bert --fusion.method "
    "dwatt --fusion.mode ft --data.batch_size 16 --optim.lr 5e-5 --optim.schedule linear "
    "--optim.min_lr_ratio 0 --optim.warmup_steps 0 --run.dir runs/ner-hf":
        "fine-tunes all of all-MiniLM-L6-v2 (22M parameters); the NER command over "
        "runs/bert-mini runs the NER pipeline",
}

# Appended to every command that runs: they only make it shorter. mesh.data 1: one device, as
# a user's CPU gives (what the tests see anyway, conftest.py; kept for a run with -p no:...).
# data.batch_size 8: a step of 32 sequences costs seconds on a loaded 2-core machine.
# data.grammar_docs 2000, not fewer: the tokenizer of runs/default must keep the semantic
# parsing task's longest training example within data.seq_len 128, as the default run's does
# (128 tokens at 20000 and at 2000 documents; 136 at 1000).
SHORTEN = ("--run.steps 2 --run.eval_every 2 --run.save_every 2 --run.log_every 1 "
           "--run.samples 0 --run.grammar_samples 0 --run.eval_batches 2 --task.eval_max 8 "
           "--data.grammar_docs 2000 --data.batch_size 8 --run.progress false "
           "--mesh.data 1").split()


def shorten(argv: list[str]) -> list[str]:
    """SHORTEN, less the fields that argv's kind of run does not read (train.py refuses them)."""
    from _train_helpers import flags, read_by_kind

    return flags([], read_by_kind(list(argv), dict(zip((f[2:] for f in SHORTEN[::2]),
                                                       SHORTEN[1::2])), {}))


def producer(run: str) -> Command:
    """The first documented command that writes run directory `run` (as written), which the
    commands that read `run` (--config, --task.init_from) take as made by it."""
    for c in COMMANDS:
        if c.key not in NOT_RUN and "--help" not in c.argv and "--config" not in c.argv \
                and parse_args(list(c.argv)).run.dir == run:
            return c
    raise AssertionError(f"no documented command makes {run}, which another one reads")


def _read_runs(cmd: Command) -> list[str]:
    """The run directories of earlier commands that cmd reads."""
    out = []
    for flag, a in zip(cmd.argv, cmd.argv[1:]):
        if flag == "--config":
            out.append(a.rpartition("/")[0])
        elif flag == "--task.init_from" and a.startswith("runs/"):
            out.append(a)
    return out


def _expected(cmd: Command):
    assert cmd.key in EXPECTED, (
        f"{cmd.where}: `python train.py {cmd.key}` has no expected recipe: add it to EXPECTED "
        f"(and to NOT_RUN if it cannot run on a CPU)")
    return EXPECTED[cmd.key]


# ----------------------------------------------------------------------------- fixtures

def _load_train_entry():
    import jaxdepth.train  # what train.py runs
    return jaxdepth.train


@dataclass
class Ran:
    run_dir: Path
    stdout: str


class Runs:
    """The module's runs, each made once: by its command's own test, or first by a later
    command that names its run directory (runs/default, runs/act-tiny, runs/bert-mini)."""

    def __init__(self, root: Path):
        self.root = root
        self.request = None  # the running test's: its shared_data fixture skips without the data
        self.done: dict[tuple, Ran | BaseException] = {}
        self.entry = _load_train_entry()
        self.files = root / "files"
        self.files.mkdir()
        self._made: dict[str, Path] = {}

    # -- placeholders
    def file(self, name: str) -> Path:
        if name not in self._made:
            make = getattr(self, "_make_" + re.sub(r"\W", "_", name), None)
            assert make is not None, f"no fixture stands for the placeholder path {name!r}: " \
                                     f"add a Runs._make_ method for it"
            self._made[name] = make()
        return self._made[name]

    def _make_my_corpus_txt(self) -> Path:
        return self._text_corpus("my_corpus.txt", 400, seed=0)

    def _make_my_valid_txt(self) -> Path:
        return self._text_corpus("my_valid.txt", 40, seed=1)

    def _text_corpus(self, name: str, n_docs: int, seed: int) -> Path:
        # model.vocab_size 8000 needs text with more than 8000 distinct pieces: pseudo-words
        rng = random.Random(0)
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9)))
                 for _ in range(8000)]
        rng = random.Random(seed)
        docs = ["\n".join(" ".join(rng.choices(words, k=12)) for _ in range(10))
                for _ in range(n_docs)]
        path = self.files / name
        path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        return path

    def _grammar_jsonl(self, n_docs: int, seed: int) -> list[str]:
        from jaxdepth.data.embedded.grammar import corpus_texts
        return [json.dumps({"text": t}) for t in corpus_texts(n_docs, seed)]

    def _make_shard0_jsonl(self) -> Path:
        path = self.files / "shard0.jsonl"
        path.write_text("\n".join(self._grammar_jsonl(150, 11)) + "\n", encoding="utf-8")
        return path

    def _make_shard1_jsonl_gz(self) -> Path:
        path = self.files / "shard1.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write("\n".join(self._grammar_jsonl(150, 12)) + "\n")
        return path

    def _make_spm_model(self) -> Path:
        return self.made("runs/default") / "data" / "tokenizer.model"

    def _make_path_to_hf_bert(self) -> Path:
        pytest.importorskip("tokenizers")
        return self.request.getfixturevalue("minilm_dir")

    def data(self, name: str) -> Path:
        path = self.request.getfixturevalue("shared_data") / name
        if not path.exists():
            pytest.skip(f"{name} is not in the shared data directory")
        return path

    def substitute(self, cmd: Command, for_run: bool) -> list[str]:
        """cmd's arguments with every placeholder path replaced by a real one. Parsing needs
        only the file parse_args reads (--config: the config.json the command that makes
        that run writes, without running it); running needs all of them."""
        out = []
        for i, a in enumerate(cmd.argv):
            flag = cmd.argv[i - 1] if i else ""
            if a == "$i":
                a = "0"
            elif flag == "--config" and for_run:
                run, _, rest = a.rpartition("/")
                a = str(self.made(run) / rest)
            elif flag == "--config":  # the config.json the README's command writes
                run = a.rpartition("/")[0]
                path = self.files / (run.replace("/", "_") + ".config.json")
                path.write_text(json.dumps(parse_args(list(producer(run).argv)).to_dict()))
                a = str(path)
            elif not for_run or flag in ("--run.dir",):
                pass
            elif flag == "--task.init_from" and a.startswith("runs/"):
                a = str(self.made(a))
            elif flag == "--task.dir" and a.startswith("data/"):
                a = str(self.data(a[len("data/"):]))
            elif flag in ("--data.corpus", "--data.valid", "--data.tokenizer", "--task.init_from"):
                a = ",".join(str(self.file(p)) for p in a.split(","))
            out.append(a)
        return out

    # -- runs
    def made(self, run: str) -> Path:
        return self.run(producer(run)).run_dir

    def run(self, cmd: Command) -> Ran:
        """cmd run for 2 steps (once: later calls return the first one's run, or fail as it
        did)."""
        done = self.done.get(cmd.argv)
        if isinstance(done, BaseException):
            raise AssertionError(f"{cmd.where} failed earlier in this module") from done
        if done is not None:
            return done
        argv = self.substitute(cmd, for_run=True)  # may skip: then nothing is recorded
        run_dir = self.root / f"run{len(self.done)}"
        argv += shorten(argv) + ["--run.dir", str(run_dir)]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                rc = self.entry._train(argv)
            assert rc == 0, f"{cmd.where}: train.py returned {rc}"
        except Exception as e:
            self.done[cmd.argv] = e
            raise
        self.done[cmd.argv] = Ran(run_dir, out.getvalue())
        return self.done[cmd.argv]


@pytest.fixture(scope="module")
def module_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme_runs")
    # JAX's persistent compilation cache while the module runs, as an experiment's units
    # share one: commands of one model shape (the default run, --config of it, its
    # tokenizer, JSONL shards) compile once
    with shared_compilations(root / "jax_cache"):
        yield Runs(root)


@pytest.fixture
def runs(module_runs, request):
    module_runs.request = request
    yield module_runs
    module_runs.request = None


# ----------------------------------------------------------------------------- tests

def test_commands_are_found():
    """The extractor cannot rot silently: the documents have their commands (the README its
    quickstart; the docs pages the rest), each file is read."""
    by_file = {}
    for c in COMMANDS:
        by_file.setdefault(c.where.split(":")[0], []).append(c)
    assert len(COMMANDS) >= 30, len(COMMANDS)
    assert "" in {c.key for c in by_file.get("README.md", [])}, sorted(by_file)
    for page in ("docs/training.md", "docs/data.md", "docs/act.md", "docs/fusion.md"):
        assert by_file.get(page), sorted(by_file)
    # a continued command is read whole, comments and "..." dropped
    keys = {c.key for c in COMMANDS}
    assert "--preset act-cpu --run.dir runs/act-cpu" in keys
    assert any(c.env == ("XLA_FLAGS=--xla_force_host_platform_device_count=8",) for c in COMMANDS)


def test_expectations_name_documented_commands():
    keys = {c.key for c in COMMANDS}
    stale = sorted(set(EXPECTED) - keys) + sorted(set(NOT_RUN) - keys)
    assert not stale, f"EXPECTED / NOT_RUN name commands no document has any more: {stale}"
    assert set(NOT_RUN) <= set(EXPECTED) and set(FULL_ONLY) <= set(EXPECTED)
    assert not set(NOT_RUN) & set(FULL_ONLY)
    # a run another command reads is made in every mode
    for c in COMMANDS:
        if c.key not in NOT_RUN:
            for run in _read_runs(c):
                assert producer(run).key not in FULL_ONLY, (c.where, run)


def test_experiment_commands_are_found():
    """The cluster page has a command for each engine, each parsed below."""
    cluster = [argv for where, _, argv in EXPERIMENT_COMMANDS
               if where.startswith("docs/cluster.md")]
    for flags in (["--executor", "slurm"], ["--executor", "ray"], ["--processes", "auto"]):
        assert any(" ".join(flags) in " ".join(argv) for argv in cluster), flags
    assert len(EXPERIMENT_COMMANDS) >= 15, EXPERIMENT_COMMANDS


@pytest.mark.parametrize("where, experiment, argv", EXPERIMENT_COMMANDS,
                         ids=[w for w, _, _ in EXPERIMENT_COMMANDS])
def test_experiment_command_parses(where, experiment, argv):
    import importlib

    from jaxdepth.experiments.executors import executor_from_args

    module = importlib.import_module(f"jaxdepth.experiments.{experiment}")
    args = module.parse(argv)
    module.plan_from_args(args)  # the plan's checks: sizes, depths, tasks, seeds, overrides
    if args.executor != "local":  # the engine's module: the test extra installs both
        pytest.importorskip({"ray": "ray", "slurm": "submitit"}[args.executor])
    executor_from_args(args)


def test_extract_on_a_sample(tmp_path):
    text = ("Run `python train.py --help` here.\n```bash\n"
            "pip install -e . && python train.py\n"
            "python train.py --a.b 1 \\\n    --c.d 'x y'   # a comment\n"
            "# python train.py --not.this 1\n"
            "FOO=1 python train.py --e.f 2 ...\n"
            "srun -N 4 --ntasks-per-node=1 python -m jaxdepth.train --g.h auto\n"
            "jaxdepth-train --i.j 3\n```\n")
    (tmp_path / "x.md").write_text(text)
    got = [(c.where, c.env, c.argv) for c in extract("x.md", tmp_path)]
    assert got == [("x.md:1", (), ("--help",)), ("x.md:3", (), ()),
                   ("x.md:4", (), ("--a.b", "1", "--c.d", "x y")),
                   ("x.md:7", ("FOO=1",), ("--e.f", "2")), ("x.md:8", (), ("--g.h", "auto")),
                   ("x.md:9", (), ("--i.j", "3"))]
    assert extract("x.md", tmp_path)[4].launcher == ("srun", "-N", "4", "--ntasks-per-node=1")


def _check_recipe(cfg, want, where: str) -> None:
    kind, name, lr, schedule = want
    got = (kind_of(cfg).NAME, cfg.optim.name, cfg.optim.lr, cfg.optim.schedule)
    assert got[:2] == (kind, name) and math.isclose(got[2], lr, rel_tol=1e-9) \
        and got[3] == schedule, f"{where}: (kind, optim.name, lr, schedule) {got}, expected {want}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_parses_with_its_recipe(cmd, runs, capsys):
    want = _expected(cmd)
    if want is None:  # --help
        with pytest.raises(SystemExit) as e:
            parse_args(list(cmd.argv))
        assert e.value.code == 0 and "presets:" in capsys.readouterr().out
        return
    cfg = parse_args(runs.substitute(cmd, for_run=False))
    _check_recipe(cfg, want, cmd.where)
    recipe = [line for line in preset_lines(cfg) if line.startswith("recipe of run kind")]
    if cfg.optim.from_recipe:  # train.py's start-up line names the kind the recipe came from
        assert recipe and recipe[0].startswith(f"recipe of run kind {want[0]}: optim: "), recipe
    else:
        assert not recipe


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_command_runs(cmd, runs):
    if cmd.key in NOT_RUN:
        pytest.skip(f"parsed only: {NOT_RUN[cmd.key]}")
    if cmd.key in FULL_ONLY and not ALL:
        pytest.skip(f"run with JAXDEPTH_README_ALL=1 only: {FULL_ONLY[cmd.key]}")
    want = _expected(cmd)
    ran = runs.run(cmd)
    summary = json.loads((ran.run_dir / "summary.json").read_text())
    assert summary["done"] and summary["step"] == 2, summary
    assert math.isfinite(summary["train_loss"]), summary
    saved = json.loads((ran.run_dir / "config.json").read_text())
    got = saved["optim"]
    kind, name, lr, schedule = want
    assert (got["name"], got["schedule"]) == (name, schedule) \
        and math.isclose(got["lr"], lr, rel_tol=1e-9), f"{cmd.where}: saved optim {got}"
    if any(line.startswith("recipe of run kind") for line in ran.stdout.splitlines()):
        assert f"recipe of run kind {kind}: optim: " in ran.stdout
