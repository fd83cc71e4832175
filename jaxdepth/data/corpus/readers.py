"""Read raw text corpora (plain text or JSONL, optionally gzipped) into lists of documents.

Every error names the file, and for JSONL the line, so a bad shard in a large corpus is easy to
find.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from ...errors import DataError


def _check_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a {what} file (name the files in it, "
                        f"comma-separated)")
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")


def _open(path: Path, mode: str) -> IO:
    return gzip.open(path, mode) if path.suffix == ".gz" else path.open(mode)


def _bad_utf8(path: Path) -> str:
    """'line L, column C: byte 0xNN' of the first byte of `path` that is not UTF-8 (decoders
    work on blocks, so the line where decoding failed is found again line by line)."""
    with _open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                byte, column = raw[e.start], e.start + 1
                return f"{lineno}: not UTF-8 text (byte 0x{byte:02x} at column {column})"
    return " not UTF-8 text"


@contextmanager
def text_lines(path: str | Path, what: str = "corpus") -> Iterator[Iterator[str]]:
    """The lines of a UTF-8 text file, optionally gzipped (``.gz``), for ``with ... as lines``.

    What makes the file unreadable is a DataError naming it: a directory, bytes that are not
    UTF-8 (with the line and column), a truncated or corrupt gzip stream. `what` names the kind
    of file in messages ("corpus", "data", "NER")."""
    path = Path(path)
    _check_file(path, what)
    read = 0  # lines handed out: a truncated .gz is readable up to there

    def counted(f):
        nonlocal read
        for line in f:
            read += 1
            yield line

    try:
        with _open(path, "rt") as f:
            yield counted(f)
    except UnicodeDecodeError:
        raise DataError(f"{path}:{_bad_utf8(path)}") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        after = f": no line after line {read} can be read" if read else ""
        raise DataError(f"{path}: truncated or corrupt gzip file{after} ({e})") from None


def read_json_file(path: str | Path, what: str = "JSON"):
    """The value a JSON file holds; malformed JSON is a DataError naming the file and line."""
    path = Path(path)
    _check_file(path, what)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{path}:{_bad_utf8(path)}") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg}, column {e.colno})") from None


def _text_documents(path: Path, lines: Iterator[str], first: int):
    """(line of the document's first line, text) of each blank-line separated block."""
    current: list[str] = []
    start = first
    for lineno, line in enumerate(lines, start=first):
        line = line.rstrip("\r\n")
        if line.strip():
            if not current:
                start = lineno
            current.append(line)
        elif current:
            yield start, "\n".join(current)
            current = []
    if current:
        yield start, "\n".join(current)


def _jsonl_documents(path: Path, lines: Iterator[str], first: int, field: str):
    for lineno, line in enumerate(lines, start=first):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: malformed JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if field not in record:
            raise DataError(f"{where}: missing field {field!r}")
        value = record[field]
        if not isinstance(value, str):
            raise DataError(f"{where}: field {field!r} is {type(value).__name__}, not a string")
        yield lineno, value


def _hashed(lines: Iterator[str], digest) -> Iterator[str]:
    for line in lines:
        digest.update(line.encode("utf-8", "surrogatepass"))
        yield line


def iter_documents(path: str | Path, fmt: str = "auto", *, start_line: int = 1,
                   field: str = "text", digest=None) -> Iterator[tuple[int, str]]:
    """(line, text) of every document of one corpus file, lazily, from line `start_line` on:
    the line is where the document starts, so a reader stopped at a document resumes there.

    JSONL (one object per line, the string `field`) or plain text (blocks of lines separated
    by blank lines), chosen by `fmt` ("auto": by suffix), optionally gzipped. Errors name the
    file and line. `digest` (a hashlib object), if given, is updated with every line read,
    skipped ones included: when a document is yielded it has seen the file's text from its
    start through that document (and, for plain text, the blank line after it)."""
    path = Path(path)
    jsonl = _is_jsonl(path) if fmt == "auto" else fmt == "jsonl"
    with text_lines(path) as lines:
        if digest is not None:
            lines = _hashed(lines, digest)
        for _ in range(start_line - 1):  # skipped lines are only decompressed, never parsed
            if next(lines, None) is None:
                return
        docs = (_jsonl_documents(path, lines, start_line, field) if jsonl
                else _text_documents(path, lines, start_line))
        yield from docs


def _is_jsonl(path: Path) -> bool:
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    return suffix in (".jsonl", ".json")


def read_corpus(paths: Sequence[str | Path], fmt: str = "auto") -> list[str]:
    """Documents of every file in `paths`, in order.

    `fmt` is "auto" (`.jsonl`/`.json`, optionally `.gz`, are JSONL; anything else is plain text),
    "jsonl" or "text". Documents that are empty or whitespace-only are dropped.
    """
    if fmt not in ("auto", "jsonl", "text"):
        raise ValueError(f"unknown corpus format {fmt!r}; expected 'auto', 'jsonl' or 'text'")
    paths = [Path(p) for p in paths]
    docs = [d for path in paths for _, d in iter_documents(path, fmt) if d.strip()]
    if not docs:
        names = ", ".join(str(p) for p in paths) or "(no paths given)"
        raise DataError(f"empty corpus: no non-empty document in {names}")
    return docs


def resolve_paths(spec: str, setting: str) -> list[str]:
    """The files a comma-separated `spec` names, each entry a file, a directory (every file
    in it, sorted) or a glob (``c4/en/c4-train.*-of-01024.json.gz``, sorted); in the order
    given, without repeats, so the list is the same on every host. An entry that names
    nothing is an error naming `setting` and the entry."""
    files: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        path = Path(entry)
        if any(c in entry for c in "*?["):  # a glob
            found = sorted(p for p in glob.glob(entry) if os.path.isfile(p))
            if not found:
                raise FileNotFoundError(f"{setting}: no file matches {entry!r}")
        elif path.is_dir():
            found = sorted(str(p) for p in path.iterdir() if p.is_file()
                           and not p.name.startswith("."))
            if not found:
                raise FileNotFoundError(f"{setting}: directory {entry} holds no file")
        else:
            _check_file(path, "corpus")
            found = [str(path)]
        files.extend(found)
    if not files:
        raise FileNotFoundError(f"{setting}: no corpus file given")
    return list(dict.fromkeys(files))
