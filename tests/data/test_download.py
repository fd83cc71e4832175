"""The downloader against a loopback HTTP server (no network), and the real registry checked
against the readers' file names and, when present, the files of the shared data directory
(the shared_data fixture)."""
import hashlib
import re
import shutil
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from jaxdepth.data import download as dl
from jaxdepth.data.download import (
    REGISTRY,
    ChecksumError,
    Dataset,
    DownloadError,
    Remote,
    default_cache_dir,
    download,
    main,
)
from jaxdepth.data.finetune.seq2seq_readers import COGS_SPLITS, PASSIVIZATION_SPLITS, read_cogs

TASK_FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Server:
    """Serves `root` on 127.0.0.1 and records every requested path."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[str] = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(TASK_FIXTURES / "cogs", root / "cogs")
    s = _Server(root)
    yield s
    s.close()


@pytest.fixture
def toy(server, tmp_path):
    """Two served files (one in a subdirectory) and a registry naming them."""
    name = tmp_path.name  # a fresh served directory per test, so tests cannot interfere
    files = {"a.txt": b"alpha\n", "sub/b.txt": b"beta\nbeta\n"}
    for rel, data in files.items():
        path = server.root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    registry = {"toy": Dataset(f"{server.url}/{name}",
                               tuple(Remote(rel, rel, _sha(d), len(d)) for rel, d in files.items()))}
    server.requests.clear()
    return registry, files, server.root / name


def _leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.endswith(".part")]


# ---------------------------------------------------------------------------------------------
# download()
# ---------------------------------------------------------------------------------------------

def test_download_then_cached(server, toy, tmp_path):
    registry, files, _ = toy
    out = download("toy", tmp_path / "cache", registry=registry)
    assert out == tmp_path / "cache" / "toy"
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data
    assert len(server.requests) == 2

    assert download("toy", tmp_path / "cache", registry=registry) == out
    assert len(server.requests) == 2  # valid files: no request at all

    download("toy", tmp_path / "cache", registry=registry, force=True)
    assert len(server.requests) == 4
    assert not _leftovers(out)


def test_invalid_cached_file_is_replaced(toy, tmp_path):
    registry, files, _ = toy
    out = download("toy", tmp_path, registry=registry)
    (out / "a.txt").write_bytes(b"truncat")
    download("toy", tmp_path, registry=registry)
    assert (out / "a.txt").read_bytes() == files["a.txt"]


def test_checksum_mismatch_leaves_no_file(toy, tmp_path):
    registry, files, served = toy
    (served / "a.txt").write_bytes(b"tampered\n")
    with pytest.raises(ChecksumError) as err:
        download("toy", tmp_path, registry=registry)
    msg = str(err.value)
    assert "/a.txt" in msg and _sha(files["a.txt"]) in msg and _sha(b"tampered\n") in msg
    assert not (tmp_path / "toy" / "a.txt").exists()
    assert not _leftovers(tmp_path)


def test_checksum_mismatch_keeps_valid_file(toy, tmp_path):
    registry, files, served = toy
    out = download("toy", tmp_path, registry=registry)
    (served / "a.txt").write_bytes(b"tampered\n")
    with pytest.raises(ChecksumError):
        download("toy", tmp_path, registry=registry, force=True)
    assert (out / "a.txt").read_bytes() == files["a.txt"]
    assert not _leftovers(out)


def test_http_404_names_url(toy, tmp_path):
    registry, _, served = toy
    (served / "sub" / "b.txt").unlink()
    with pytest.raises(DownloadError, match=r"/sub/b\.txt: HTTP 404") as err:
        download("toy", tmp_path, registry=registry)
    assert not isinstance(err.value, ChecksumError)
    assert not (tmp_path / "toy" / "sub" / "b.txt").exists()
    assert not _leftovers(tmp_path)


def test_unreachable_host_is_download_error(tmp_path):
    # Port 1 on loopback: refused at once, no real network involved.
    registry = {"x": Dataset("http://127.0.0.1:1", (Remote("f", "f", "0" * 64),))}
    with pytest.raises(DownloadError, match=r"http://127\.0\.0\.1:1/f"):
        download("x", tmp_path, registry=registry, timeout=2)


def test_base_url_overrides_default(server, toy, tmp_path):
    registry, files, served = toy
    moved = {"toy": Dataset("http://invalid.example", registry["toy"].files)}
    out = download("toy", tmp_path, registry=moved, base_url=f"{server.url}/{served.name}/")
    assert (out / "a.txt").read_bytes() == files["a.txt"]


def test_unknown_dataset_and_bad_filename(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        download("nope", tmp_path)
    bad = {"x": Dataset("http://127.0.0.1:1", (Remote("f", "../f", "0" * 64),))}
    with pytest.raises(ValueError, match="bad filename"):
        download("x", tmp_path, registry=bad)


def test_downloaded_layout_is_what_the_reader_reads(server, tmp_path):
    data = {s: (TASK_FIXTURES / "cogs" / f"{s}.tsv").read_bytes() for s in ("train", "gen")}
    registry = {"cogs": Dataset(f"{server.url}/cogs", tuple(
        Remote(f"{s}.tsv", f"{s}.tsv", _sha(d)) for s, d in data.items()))}
    out = download("cogs", tmp_path, registry=registry)
    for split in data:
        got, want = read_cogs(out, split), read_cogs(TASK_FIXTURES / "cogs", split)
        assert [(e.source, e.target, e.type, e.line) for e in got] == [
            (e.source, e.target, e.type, e.line) for e in want]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXDEPTH_DATA", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("JAXDEPTH_DATA")
    assert default_cache_dir() == Path.home() / ".cache" / "jaxdepth"


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def test_cli_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, dataset in REGISTRY.items():
        assert name in out
        assert all(r.filename in out for r in dataset.files)


def test_cli_download_and_failure(monkeypatch, toy, tmp_path, capsys):
    registry, files, served = toy
    monkeypatch.setitem(dl.REGISTRY, "toy", registry["toy"])
    assert main(["toy", "--cache", str(tmp_path)]) == 0
    assert f"toy: {tmp_path / 'toy'}" in capsys.readouterr().out
    assert (tmp_path / "toy" / "sub" / "b.txt").read_bytes() == files["sub/b.txt"]

    (served / "a.txt").unlink()
    assert main(["toy", "--cache", str(tmp_path / "fresh")]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith("error: ") and "a.txt: HTTP 404" in err


# ---------------------------------------------------------------------------------------------
# The real registry
# ---------------------------------------------------------------------------------------------

# What the readers open (jaxdepth.data.finetune.seq2seq_readers / ner), per dataset.
READER_FILES = {
    "cogs": {f"{s}.tsv" for s in COGS_SPLITS if s != "train_100"},
    "cogs_vf": {f"{s}.tsv" for s in COGS_SPLITS if s != "train_100"},
    "passivization_en": {f"passiv_en_nps.{s}" for s in PASSIVIZATION_SPLITS},
    "wikitext-2": {"train.txt", "valid.txt", "test.txt"},
    "wikiann": {"en/train", "en/dev", "en/test"},
    # read_geoquery's train/test.tsv must be built from these (see the module docstring).
    "geoquery": {"raw/corpus.xml", "raw/geobase", "splits/standard.json"},
}


def test_registry_well_formed():
    assert set(REGISTRY) == set(READER_FILES)
    for name, dataset in REGISTRY.items():
        assert dataset.files, name
        assert dataset.base.startswith("https://raw.githubusercontent.com")
        filenames = [r.filename for r in dataset.files]
        assert len(set(filenames)) == len(filenames), name
        assert READER_FILES[name] <= set(filenames), name
        for r in dataset.files:
            assert re.fullmatch(r"[0-9a-f]{64}", r.sha256), (name, r)
            assert r.size is not None and r.size > 0, (name, r)
            url = f"{dataset.base}/{r.url}"
            # Pinned to a full commit, never a branch.
            assert re.search(r"/[0-9a-f]{40}/", url), url
    assert "train.tsv" not in {r.filename for r in REGISTRY["geoquery"].files}


def test_registry_matches_shared_data(shared_data):
    for name, dataset in REGISTRY.items():
        for r in dataset.files:
            local = shared_data / name / r.filename
            assert local.stat().st_size == r.size, local
            assert dl.sha256_file(local) == r.sha256, local
    for filename, sha in dl.GEOQUERY_REBUILT_SHA256.items():
        assert dl.sha256_file(shared_data / "geoquery" / filename) == sha
