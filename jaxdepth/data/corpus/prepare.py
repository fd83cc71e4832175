"""Corpus -> what an LM run reads: its tokenizer and its training and validation data.

Small corpora (the embedded grammar, WikiText-2) are tokenized once into ``<run>/data``:
``tokenizer.model``, ``train.npy``, ``valid.npy``; process 0 prepares, the others wait at a
barrier and memory-map the files. A streamed corpus (``data.streaming``, C4) only gets its
tokenizer there: training reads and tokenizes the files as it goes (data/corpus/streaming.py), and
the validation windows are packed from the validation files in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...config import ConfigError, DataConfig
from ...errors import DataError, warn, writing
from .. import shared_prep
from ..embedded import grammar
from .packing import document_ids, iter_windows
from .pipeline import load_tokens, save_tokens, split_documents, tokenize_documents, window_batches
from .readers import iter_documents, read_corpus, resolve_paths
from .streaming import CorpusChanged, first_change
from .tokenizer import Tokenizer, train_tokenizer


# Validation documents kept for greedy samples and the grammar metric's prompts.
N_PROMPT_DOCS = 128


@dataclass
class LMData:
    tokenizer: Tokenizer
    train: np.ndarray  # flat int32 token streams (memory-mapped)
    valid: np.ndarray
    valid_docs: list[str]  # a few validation documents, for greedy samples


def training_files(cfg: DataConfig, announce: bool = True) -> list[str]:
    """The files data.corpus names (files, directories, globs), less any that data.valid
    names too: a validation file is never trained on (announce: say so in a warning)."""
    files = resolve_paths(cfg.corpus, "data.corpus")
    if not cfg.valid.strip():
        return files
    valid = {os.path.realpath(f) for f in resolve_paths(cfg.valid, "data.valid")}
    left_out = [f for f in files if os.path.realpath(f) in valid]
    if len(left_out) == len(files):
        raise ConfigError(f"data.corpus: every file of it is also data.valid "
                          f"({', '.join(left_out[:3])}{' ...' if len(left_out) > 3 else ''}); "
                          f"name the training files", field="data.corpus")
    if left_out and announce:
        warn(f"data.corpus: {', '.join(left_out)} {'is' if len(left_out) == 1 else 'are'} "
             f"data.valid too; not trained on")
    return [f for f in files if os.path.realpath(f) not in valid]


def load_documents(cfg: DataConfig) -> tuple[list[str], list[str]]:
    """(train documents, validation documents) as the config describes them."""
    if cfg.corpus == "grammar":
        docs = grammar.corpus_texts(cfg.grammar_docs, seed=cfg.grammar_seed)
    else:
        docs = read_corpus(training_files(cfg))
    if cfg.valid:
        return docs, read_corpus(resolve_paths(cfg.valid, "data.valid"))
    return split_documents(docs, cfg.valid_fraction, seed=cfg.valid_seed)


def corpus_name(cfg: DataConfig) -> str:
    """How messages name the training corpus."""
    return "the embedded grammar corpus" if cfg.corpus == "grammar" else f"data.corpus {cfg.corpus}"


def check_vocab(tok: Tokenizer, vocab_size: int, source: str,
                vocab_field: str = "model.vocab_size") -> None:
    if tok.vocab_size != vocab_size:
        raise ConfigError(f"{vocab_field}: {vocab_size} does not match the tokenizer "
                          f"({source}) with {tok.vocab_size} pieces")


def tokenizer_source(init_from: str, tokenizer: str) -> tuple[str, str] | None:
    """Where ``run_tokenizer`` copies a run's tokenizer from, with the setting that named it:
    the pretrained run's (task.init_from), else data.tokenizer, else None (train one)."""
    if init_from:
        return str(Path(init_from) / "data" / "tokenizer.model"), "task.init_from"
    return (tokenizer, "data.tokenizer") if tokenizer else None


def run_tokenizer(run_dir: Path, vocab_size: int, is_primary: bool, barrier=lambda: None, *,
                  copy_from: tuple[str, str] | None = None, texts=None,
                  required_chars: str = "", source: str = "the training text",
                  vocab_field: str = "model.vocab_size", model_type: str = "unigram") -> Tokenizer:
    """The run's tokenizer, ``<run>/data/tokenizer.model``: kept if present (a resumed run),
    else copied from ``copy_from = (path, the setting that named it)`` or trained on
    ``texts()`` (called only then, with SentencePiece's `model_type`; `source` names them in
    errors). Process 0 writes it
    through a temporary file, so an interrupted run never leaves half a tokenizer; every
    process checks its size."""
    path = run_dir / "data" / "tokenizer.model"
    if is_primary and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        if copy_from is not None:
            src, setting = copy_from
            if not Path(src).is_file():
                raise FileNotFoundError(f"{setting}: no tokenizer at {src}")
            tok = Tokenizer.load(src)  # the same bytes, written as a trained one is
        else:
            tok = train_tokenizer(texts(), vocab_size, model_type, required_chars=required_chars,
                                  source=source, vocab_field=vocab_field)
        tok.save(path)  # atomic: a failed write leaves no partial file
    barrier()
    tok = Tokenizer.load(path)
    check_vocab(tok, vocab_size, str(path), vocab_field)
    if tok.model_type != model_type:
        # A copied or resumed tokenizer is used as it is; say so rather than let config.json's
        # data.tokenizer_type claim an algorithm the run does not use.
        origin = f"copied from {copy_from[1]}" if copy_from else "kept from an earlier start"
        warnings.warn(f"{path}: a {tok.model_type} tokenizer ({origin}) is used; "
                      f"data.tokenizer_type={model_type} applies only to a tokenizer trained "
                      "by this run", stacklevel=2)
    return tok


def _file_stamp(path: str) -> list:
    """[size, modification time in ns, BLAKE2b of the bytes] of a file: the hash makes it
    exact, the size and time say what changed."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, digest.hexdigest()]


def _source_stamp(cfg: DataConfig, vocab_size: int) -> dict:
    """What the cached files were built from (window length and batch size do not matter):
    the data fields and, under "files", every file read (corpus, validation, tokenizer) with
    its _file_stamp. The grammar corpus is a function of its fields."""
    fields = ("corpus", "valid", "valid_fraction", "valid_seed", "grammar_docs", "grammar_seed",
              "tokenizer", "tokenizer_type")
    stamp = {**{f: getattr(cfg, f) for f in fields}, "vocab_size": vocab_size}
    files = [] if cfg.corpus == "grammar" else resolve_paths(cfg.corpus, "data.corpus")
    files += resolve_paths(cfg.valid, "data.valid") if cfg.valid.strip() else []
    files += [cfg.tokenizer] if cfg.tokenizer else []
    stamp["files"] = {f: _file_stamp(f) for f in dict.fromkeys(files)}
    return stamp


def _files_change(saved: dict, now: dict) -> str:
    """One line naming a file whose stamp differs and what changed; "" if none does."""
    changes = [f"{f}: read when the cache was built, no longer named" for f in saved
               if f not in now]
    changes += [f"{f}: added since the cache was built" for f in now if f not in saved]
    for f, (size, _, digest) in now.items():
        if f in saved and (saved[f][0], saved[f][2]) != (size, digest):
            what = (f"size {saved[f][0]} -> {size} bytes" if saved[f][0] != size
                    else "same size, other bytes")
            changes.append(f"{f}: changed since the cache was built ({what})")
    return first_change(changes)


def _has_checkpoint(run_dir: Path) -> bool:
    d = run_dir / "checkpoints"
    return d.is_dir() and any(p.name.isdigit() for p in d.iterdir())


# What prepare_lm_data does with <run>/data (_cache_state).
CURRENT, BUILD, RETOKENIZE = "current", "build", "re-tokenize"


def _cache_state(stamp_path: Path, stamp: dict, cfg: DataConfig, run_dir: Path) -> str:
    """CURRENT when <run>/data holds the tokens of exactly these sources. Built from other
    data fields (or never completed): BUILD it anew, its tokenizer too. From files that
    changed since: the run's checkpoints trained on the cached tokens, so a resume is refused
    (CorpusChanged) unless data.restart_stream asks to RETOKENIZE the corpus with the run's
    tokenizer (a retrained one would give the trained embeddings other pieces: refused too
    if it is gone); without a checkpoint it is built anew. A stamp written before files were
    stamped is taken as it is."""
    if not stamp_path.is_file():
        return BUILD
    try:
        saved = json.loads(stamp_path.read_text())
    except json.JSONDecodeError:
        return BUILD
    if {k: v for k, v in saved.items() if k != "files"} != \
            {k: v for k, v in stamp.items() if k != "files"}:
        return BUILD
    if "files" not in saved:
        return CURRENT
    change = _files_change(saved["files"], stamp["files"])
    if not change:
        return CURRENT
    if not _has_checkpoint(run_dir):
        return BUILD
    data_dir = stamp_path.parent
    if not cfg.restart_stream:
        raise CorpusChanged(f"{change}; the checkpoints in {run_dir / 'checkpoints'} trained on "
                            f"the tokens cached in {data_dir} from it: restore the file to "
                            f"resume exactly, give --data.restart_stream true to re-tokenize "
                            f"the corpus as it is now and resume on it, or start afresh with "
                            f"another --run.dir")
    tok_path = data_dir / "tokenizer.model"
    if not tok_path.is_file():  # deleted by hand: another tokenizer would remap the ids
        raise CorpusChanged(f"{change}; data.restart_stream re-tokenizes it with the tokenizer "
                            f"the checkpoints in {run_dir / 'checkpoints'} trained with, "
                            f"{tok_path}, which is gone: restore it, or start afresh with "
                            f"another --run.dir")
    warn(f"data.restart_stream: {change}; {data_dir} is re-tokenized with the run's tokenizer "
         f"{tok_path} from the corpus as it is now, and the run resumes on it at its "
         f"checkpoint's step")
    return RETOKENIZE


def _build_lm_data(cfg: DataConfig, vocab_size: int, tok_path: Path,
                   state: str) -> tuple[Tokenizer, np.ndarray, np.ndarray, str]:
    """(tokenizer, train tokens, validation tokens, the prompt documents' text)."""
    train_docs, valid_docs = load_documents(cfg)
    source = str(tok_path)
    if state == RETOKENIZE:
        tok = Tokenizer.load(tok_path)
    elif cfg.tokenizer:
        tok, source = Tokenizer.load(cfg.tokenizer), cfg.tokenizer
    else:
        # The grammar corpus tokenizer also serves its seq2seq tasks (one tokenizer for
        # pretraining and fine-tuning), so it keeps the logical forms' symbols.
        chars = grammar.LF_SYMBOLS if cfg.corpus == "grammar" else ""
        tok = train_tokenizer(train_docs, vocab_size, cfg.tokenizer_type, required_chars=chars,
                              source=corpus_name(cfg))
    check_vocab(tok, vocab_size, source)
    prompts = "\n\n".join(d.replace("\n\n", "\n") for d in valid_docs[:N_PROMPT_DOCS])
    return (tok, tokenize_documents(train_docs, tok), tokenize_documents(valid_docs, tok),
            prompts)


def prepare_lm_data(cfg: DataConfig, vocab_size: int, run_dir: Path, is_primary: bool,
                    barrier=lambda: None) -> LMData:
    """Build (or reuse) the run's tokenizer and token files.

    The cache is reused only if it was built from the same data fields and files
    (_cache_state); the stamp recording them is written last, so an interrupted
    preparation is redone. (Resuming a checkpoint with other data fields is refused before
    this is called.)
    """
    data_dir = run_dir / "data"
    tok_path = data_dir / "tokenizer.model"
    stamp_path = data_dir / "source.json"
    state = CURRENT
    if is_primary:
        state = _cache_state(stamp_path, stamp := _source_stamp(cfg, vocab_size), cfg, run_dir)
    if state != CURRENT:
        # RETOKENIZE keeps this run's own tokenizer; a BUILD is a function of the stamp alone
        # (every file in it hashed), which the trials of one run share.
        key = shared_prep.digest("lm", json.dumps(stamp, sort_keys=True),
                                 tok_path.read_bytes() if state == RETOKENIZE else b"")
        tok, train_tokens, valid_tokens, prompts = shared_prep.prepared(
            key, lambda: _build_lm_data(cfg, vocab_size, tok_path, state))
        data_dir.mkdir(parents=True, exist_ok=True)
        with writing(data_dir):
            if state != RETOKENIZE:
                tok.save(tok_path)
            save_tokens(data_dir / "train.npy", train_tokens)
            (data_dir / "valid_docs.txt").write_text(prompts)
            save_tokens(data_dir / "valid.npy", valid_tokens)
            stamp_path.write_text(json.dumps(stamp, sort_keys=True))
    barrier()
    tok = Tokenizer.load(tok_path)
    check_vocab(tok, vocab_size, str(tok_path))
    valid_docs = (data_dir / "valid_docs.txt").read_text().split("\n\n")
    return LMData(tok, load_tokens(data_dir / "train.npy"), load_tokens(data_dir / "valid.npy"),
                  valid_docs)


# ----------------------------------------------------------------------------- streamed corpora

@dataclass
class StreamData:
    tokenizer: Tokenizer
    tokenizer_path: Path  # what each loader worker loads
    files: list[str]  # the training files, sorted (the order every host deals into streams)
    valid: list[dict]  # packed validation batches (pipeline.py:window_batches)
    valid_docs: list[str]  # a few validation documents, for greedy samples


def sample_documents(files: list[str], n: int) -> list[str]:
    """About n documents drawn across all files: the first ceil(n / len(files)) of each, so
    a tokenizer sees every shard while reading a bounded share of the corpus."""
    quota, out = -(-n // len(files)), []
    for path in files:
        docs = (d for _, d in iter_documents(path) if d.strip())
        out.extend(d for _, d in zip(range(quota), docs))
        if len(out) >= n:
            break
    if not out:
        raise DataError(f"empty corpus: no non-empty document in {', '.join(files[:3])}"
                        f"{' ...' if len(files) > 3 else ''}")
    return out[:n]


def valid_documents(files: list[str]):
    """Every document of the validation files, in file order."""
    for path in files:
        yield from (d for _, d in iter_documents(path) if d.strip())


def prepare_streaming(cfg: DataConfig, vocab_size: int, run_dir: Path, is_primary: bool,
                      barrier=lambda: None, max_valid_batches: int = 0,
                      batch_size: int = 0) -> StreamData:
    """The tokenizer (data.tokenizer, or trained on data.tokenizer_sample documents drawn
    across the shards) and the validation set: the data.valid documents packed into batches
    of `batch_size` (0: data.batch_size) windows, at most max_valid_batches (0: all) of them,
    reading only the documents those need."""
    if cfg.corpus == "grammar":
        raise ConfigError("data.corpus: data.streaming reads a corpus of files (e.g. --data.corpus "
                          "'c4/en/c4-train.*-of-01024.json.gz'), not the embedded grammar",
                          field="data.corpus")
    if not cfg.valid.strip():
        raise ConfigError("data.valid: data.streaming reads validation from its own files (e.g. "
                          "--data.valid 'c4/en/c4-validation.*-of-00008.json.gz')",
                          field="data.valid")
    files = training_files(cfg, announce=is_primary)
    valid_files = resolve_paths(cfg.valid, "data.valid")
    copy = (cfg.tokenizer, "data.tokenizer") if cfg.tokenizer else None
    tok = run_tokenizer(run_dir, vocab_size, is_primary, barrier, copy_from=copy,
                        texts=lambda: sample_documents(files, cfg.tokenizer_sample),
                        source=corpus_name(cfg), model_type=cfg.tokenizer_type)
    shown: list[str] = []

    def tokenized():
        for d in valid_documents(valid_files):
            if len(shown) < N_PROMPT_DOCS:
                shown.append(d)
            yield document_ids(tok.encode(d))

    valid = window_batches(iter_windows(tokenized(), cfg.seq_len), batch_size or cfg.batch_size,
                           max_valid_batches)
    if not valid:
        raise DataError(f"data.valid: no non-empty document in {', '.join(valid_files)}")
    return StreamData(tok, run_dir / "data" / "tokenizer.model", files, valid, shown)
