"""Files written whole or not at all: a full disk, a file-size limit or a kill mid-write leaves
the previous file (or none), never half of one that a later reader would take as it is."""
from __future__ import annotations

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
