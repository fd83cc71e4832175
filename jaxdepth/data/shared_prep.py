"""Data preparation kept in the process by what it was built from, for the trials of a run.

The K trials of one run (the seeds of a depth sweep's unit) read the same corpus or task,
so each would generate the grammar, train the same tokenizer and tokenize the same texts
(host work that can outweigh the steps: benchmarks/README.md, "The 45-seed sweep"). Here the
result is built once per key. A key names everything the result depends on (the corpus stamp
with its files' hashes, the tokenizer's bytes, the examples' texts), so another key builds
anew and nothing stale is ever returned. Arrays are handed out read-only: every trial holds
the same ones.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Callable, Iterable, TypeVar

import numpy as np

T = TypeVar("T")

# A sweep works through its units one after another: a few entries cover the current one.
_KEEP = 4
_kept: OrderedDict[str, object] = OrderedDict()


def digest(*parts: str | bytes | int | Iterable[str]) -> str:
    """One hash of the parts, in order; an iterable part is hashed item by item."""
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        items = [part] if isinstance(part, (str, bytes, int)) else part
        for item in items:
            b = item if isinstance(item, bytes) else str(item).encode()
            h.update(len(b).to_bytes(8, "little"))  # "ab","c" and "a","bc" differ
            h.update(b)
        h.update(b"\xff" * 8)
    return h.hexdigest()


def _read_only(value):
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    elif isinstance(value, dict):
        for v in value.values():
            _read_only(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _read_only(v)
    return value


def prepared(key: str, build: Callable[[], T]) -> T:
    """build()'s result for `key`, built on the first call with that key."""
    if key in _kept:
        _kept.move_to_end(key)
        return _kept[key]
    value = _read_only(build())
    _kept[key] = value
    while len(_kept) > _KEEP:
        _kept.popitem(last=False)
    return value
