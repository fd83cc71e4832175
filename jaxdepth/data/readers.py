"""Read raw text corpora (plain text or JSONL, optionally gzipped) into lists of documents.

Every error names the file, and for JSONL the line, so a bad shard in a large corpus is easy to
find.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO


def _open_text(path: Path) -> IO[str]:
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def read_text(path: str | Path) -> list[str]:
    """Documents of a plain-text file: blocks of lines separated by blank lines."""
    docs: list[str] = []
    current: list[str] = []
    with _open_text(Path(path)) as f:
        for line in f:
            line = line.rstrip("\r\n")
            if line.strip():
                current.append(line)
            elif current:
                docs.append("\n".join(current))
                current = []
    if current:
        docs.append("\n".join(current))
    return docs


def read_jsonl(path: str | Path, field: str = "text") -> list[str]:
    """The string `field` of every JSON object in a JSONL file (C4: url, text, timestamp)."""
    path = Path(path)
    docs: list[str] = []
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: malformed JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            if field not in record:
                raise ValueError(f"{where}: missing field {field!r}")
            value = record[field]
            if not isinstance(value, str):
                raise ValueError(
                    f"{where}: field {field!r} is {type(value).__name__}, not a string"
                )
            docs.append(value)
    return docs


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
    docs: list[str] = []
    for path in paths:
        jsonl = _is_jsonl(path) if fmt == "auto" else fmt == "jsonl"
        docs.extend(read_jsonl(path) if jsonl else read_text(path))
    docs = [d for d in docs if d.strip()]
    if not docs:
        names = ", ".join(str(p) for p in paths) or "(no paths given)"
        raise ValueError(f"empty corpus: no non-empty document in {names}")
    return docs
