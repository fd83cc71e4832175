"""Test setup: 8 fake CPU devices, strict dtype/rank promotion, a key fixture.

XLA_FLAGS must be set before jax is imported anywhere, so this runs at conftest import.
"""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def getkey():
    """Fresh, deterministic keys: getkey() returns a new key each call."""
    key = jax.random.key(0)
    counter = iter(range(1 << 30))
    return lambda: jax.random.fold_in(key, next(counter))


@pytest.fixture
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA
