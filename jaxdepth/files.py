"""Files written whole or not at all: a full disk, a file-size limit or a kill mid-write leaves
the previous file (or none), never half of one that a later reader would take as it is; and
the logs appended to line by line, read back without the torn line a kill leaves."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import writing


def write_whole(path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory, renamed into
    place; a failed write removes the temporary file and names `path` in its error."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with writing(path):
            if isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL log; blank and undecodable lines (a torn write, even one torn inside a
    multi-byte character) are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no log file {path}")
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows
