"""The streaming LM data pipeline (issue 13): start-up, memory, throughput and packing.

The script writes a synthetic corpus in C4's format and measures the targets of issue 13 on it:

1. the corpus: ``--shards`` (64) training shards ``c4-train.NNNNN-of-000SS.json.gz`` of
   gzipped JSONL ``{"url", "text", "timestamp"}``, about ``--shard-mb`` (2) MB *compressed*
   each, and one validation shard. The text is WikiText-2 with ``--wikitext DIR``
   (``wiki.train.tokens`` and ``wiki.valid.tokens``): its paragraphs, in order, grouped into
   documents. Otherwise it is the embedded grammar (``grammar.corpus_texts``): its short
   documents, shuffled, joined into long ones. A document takes pieces until it has a
   lognormal number of words (median ``--doc-words`` = 300, sigma 0.5, clipped to 30..4000),
   which gives a right-skewed length distribution roughly like C4's: median about 320 words,
   mean about 360, 10th-90th percentile 180-590 with the grammar. The shards are cycles over
   one pool of text, each in its own order, so the 64 shards take about 40 s to write on two
   cores. One SentencePiece tokenizer (``--vocab-size``) is trained on
   a sample of documents and given to every run with ``--data.tokenizer``. The small corpus is
   the first ``--shards-small`` (8) shards, linked into a folder of its own under
   ``-of-00008`` names.
2. time to first step, small corpus against large: ``train.py --data.streaming true`` as a
   subprocess (``--preset``, ``--steps``, ``--seq-len``, ``--batch``, ``--streams``,
   ``--workers``, ``--eval-batches``; one device, ``--mesh.data 1``). The clock runs from
   just before the process starts until step 1's line appears in ``<run>/metrics.jsonl``. The
   loop writes that line after it has dispatched step 2, so the time includes compilation and
   two batches. The runs alternate, small then large, ``--repeats`` times, and the medians are
   compared. Target: large/small <= 1.2.
3. resident memory of the same runs: the sum of RSS over train.py's process tree (its grain
   workers included), sampled when the line of the last step (``--steps``) appears. The
   tree's PSS and USS are taken at that moment too, and the largest RSS sum seen during the
   run (sampled every 0.25 s) is recorded as well. Target: large/small <= 1.2 (on the RSS sum
   at the last step).
4. pipeline throughput: ``streaming_dataset`` alone, on the large corpus, with ``--workers``
   loader processes, at ``--pipe-seq-len`` x ``--pipe-batch`` (512 x 8 by default: the 41M
   baseline's batches). It takes ``--pipe-batches`` batches after ``--pipe-warmup`` untimed
   ones and reports tokens/s (``first_batch_s`` includes starting the workers, which import
   this script again). This is compared with the tokens/s of the real train step of the 41M
   baseline (``depth_family("41M")[2]``, float32, T=512, B=8, one device), timed by
   ``bench_step.bench_member``. Target: pipeline/step >= 3. The grammar's text with a
   512-piece vocabulary has about 3 characters per token (``chars_per_token``), against about
   4.5 for C4 with T5's 32k vocabulary, so these tokens/s overstate C4's by about 1.5x.
5. packing efficiency over the batches of (4): sum of weights / tokens. Target: >= 0.99. The
   mean number of documents (segments) per window is reported as well.

The JSON holds every measurement, ``targets`` and ``met``. It is printed and, with ``--out``,
written. ``--quick`` is a smoke run that takes seconds: 2 against 4 small shards, a few steps
of the tiny model, the tiny family's step. ``--corpus DIR`` keeps the corpus and tokenizer
there and reuses them when the settings match; otherwise they go in a temporary folder that is
deleted at the end.

    python benchmarks/bench_data.py --out bench_data.json      # 64 x 2 MB shards (~3 min)
    python benchmarks/bench_data.py --wikitext data/wikitext-2 --corpus c4_synth
    python benchmarks/bench_data.py --quick --out q.json
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import arg_parser, environment, print_table, write_json

import numpy as np

import bench_step
from jaxdepth.config import MeshConfig
from jaxdepth.models.depth_family import depth_family, param_count
from jaxdepth.data.embedded import grammar
from jaxdepth.data.corpus.readers import resolve_paths
from jaxdepth.data.corpus.streaming import streaming_dataset
from jaxdepth.data.corpus.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CORPUS_VERSION = 1  # bump when the generator changes, so a kept corpus is rebuilt
TARGETS = {"first_step_ratio_max": 1.2, "memory_ratio_max": 1.2,
           "pipeline_over_step_min": 3.0, "packing_efficiency_min": 0.99}

# --quick: the defaults a smoke run replaces (flags given explicitly still win)
QUICK = dict(shards=4, shards_small=2, shard_mb=0.03, valid_mb=0.01, pool_docs=400,
             vocab_size=256, tokenizer_docs=100, preset="tiny-L1", steps=3, seq_len=32, batch=4,
             streams=2, workers=2, repeats=1, eval_batches=1, pipe_seq_len=64, pipe_batch=4,
             pipe_warmup=2, pipe_batches=8, step_family="tiny", step_layers=2, step_seq_len=64,
             step_batch=4, step_steps=2)


# ----------------------------------------------------------------------------- the corpus

def wikitext_paragraphs(path: Path) -> list[str]:
    """The paragraphs of a WikiText file (one per line), headings (`` = Title = ``) left out."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s and not (s.startswith("=") and s.endswith("=")):
                out.append(s)
    if not out:
        raise SystemExit(f"--wikitext: no paragraph in {path}")
    return out


def text_units(split: str, *, wikitext: str | None, pool_docs: int, seed: int
               ) -> tuple[list[str], bool]:
    """(pieces of text that documents are made of, whether to keep their order): WikiText's
    paragraphs in order, or the grammar's short documents, to be shuffled."""
    if wikitext:
        return wikitext_paragraphs(Path(wikitext) / f"wiki.{split}.tokens"), True
    return grammar.corpus_texts(pool_docs, seed=seed + (split == "valid") * 7919), False


class Documents:
    """C4-length documents made of `units`: each takes units, one after another, until it has a
    lognormal number of words (median `median_words`). The units come in passes: in order, from
    a random start (ordered), or in a fresh permutation each pass."""

    def __init__(self, units: list[str], ordered: bool, rng: np.random.Generator,
                 median_words: int = 300, sigma: float = 0.5, clip: tuple[int, int] = (30, 4000)):
        self.units, self.ordered, self.rng = units, ordered, rng
        self.words = np.array([len(u.split()) for u in units])
        self.median, self.sigma, self.clip = median_words, sigma, clip
        self.order, self.pos = self._pass(), 0

    def _pass(self) -> np.ndarray:
        n = len(self.units)
        return (np.roll(np.arange(n), -int(self.rng.integers(n))) if self.ordered
                else self.rng.permutation(n))

    def take(self, n: int) -> tuple[list[str], list[int]]:
        """n documents and their word counts."""
        targets = np.clip(self.rng.lognormal(math.log(self.median), self.sigma, n), *self.clip)
        docs, counts = [], []
        for target in targets:
            parts, words = [], 0
            while words < target:
                if self.pos == len(self.order):
                    self.order, self.pos = self._pass(), 0
                i = self.order[self.pos]
                self.pos += 1
                parts.append(self.units[i])
                words += int(self.words[i])
            docs.append(("\n" if self.ordered else " ").join(parts))
            counts.append(words)
        return docs, counts


def write_shard(path: Path, docs: Documents, target_bytes: int, name: str) -> dict:
    """Write C4-format JSONL to `path`, gzipped, until it holds about `target_bytes` compressed
    bytes; its statistics."""
    n, raw, words = 0, 0, []
    with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        while f.tell() < target_bytes:  # the compressor lags its input by a few kB at most
            texts, counts = docs.take(64)
            block = "".join(json.dumps({"url": f"https://c4.synthetic/{name}/{n + i}", "text": t,
                                        "timestamp": f"2019-04-{1 + (n + i) % 28:02d}T12:00:00Z"})
                            + "\n" for i, t in enumerate(texts)).encode()
            gz.write(block)
            n, raw = n + len(texts), raw + len(block)
            words.extend(counts)
    return {"docs": n, "raw_bytes": raw, "bytes": path.stat().st_size, "words": words}


def corpus_settings(args) -> dict:
    return {"version": CORPUS_VERSION, "source": "wikitext-2" if args.wikitext else "grammar",
            "shards": args.shards, "shard_mb": args.shard_mb, "valid_mb": args.valid_mb,
            "pool_docs": None if args.wikitext else args.pool_docs, "doc_words": args.doc_words,
            "seed": args.seed, "vocab_size": args.vocab_size,
            "tokenizer_docs": args.tokenizer_docs}


def make_corpus(root: Path, args) -> dict:
    """The corpus and tokenizer under `root` (reused when its manifest has these settings);
    the manifest: settings, file names relative to root, statistics, generation time."""
    settings = corpus_settings(args)
    manifest_path = root / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("settings") == settings:
            return {**manifest, "reused": True}
    for sub in ("train", "valid"):
        shutil.rmtree(root / sub, ignore_errors=True)
    (root / "train").mkdir(parents=True)
    (root / "valid").mkdir()
    start = t0 = time.perf_counter()
    units, ordered = text_units("train", wikitext=args.wikitext, pool_docs=args.pool_docs,
                                seed=args.seed)
    pool_s = time.perf_counter() - t0
    t1 = time.perf_counter()  # the tokenizer first: a vocab_size too large fails at once
    sample, _ = Documents(units, ordered, np.random.default_rng([args.seed, 10**6 + 1]),
                          args.doc_words).take(args.tokenizer_docs)
    tok = train_tokenizer(sample, args.vocab_size, source="bench_data's synthetic corpus",
                          vocab_field="--vocab-size")
    tok.save(root / "tokenizer.model")
    tokenizer_s = time.perf_counter() - t1
    t0 = time.perf_counter()
    stats = []
    for i in range(args.shards):
        docs = Documents(units, ordered, np.random.default_rng([args.seed, i]), args.doc_words)
        name = f"c4-train.{i:05d}-of-{args.shards:05d}.json.gz"
        stats.append(write_shard(root / "train" / name, docs, int(args.shard_mb * 2**20),
                                 f"train{i:05d}"))
    v_units, v_ordered = text_units("valid", wikitext=args.wikitext, pool_docs=args.pool_docs,
                                    seed=args.seed)
    valid_docs = Documents(v_units, v_ordered, np.random.default_rng([args.seed, 10**6]),
                           args.doc_words)
    write_shard(root / "valid" / "c4-validation.00000-of-00001.json.gz", valid_docs,
                int(args.valid_mb * 2**20), "validation")
    shards_s = time.perf_counter() - t0
    generation_s = time.perf_counter() - start

    ids = tok.encode_batch(sample)
    words = np.concatenate([s.pop("words") for s in stats])
    manifest = {
        "settings": settings,
        "train_glob": f"train/c4-train.*-of-{args.shards:05d}.json.gz",
        "valid": "valid/c4-validation.00000-of-00001.json.gz", "tokenizer": "tokenizer.model",
        "generation_s": generation_s, "pool_s": pool_s, "tokenizer_train_s": tokenizer_s,
        "shards_s": shards_s,
        "shard_bytes_mean": statistics.fmean(s["bytes"] for s in stats),
        "shard_bytes_min": min(s["bytes"] for s in stats),
        "shard_bytes_max": max(s["bytes"] for s in stats),
        "shard_docs_mean": statistics.fmean(s["docs"] for s in stats),
        "compression_ratio": sum(s["raw_bytes"] for s in stats) / sum(s["bytes"] for s in stats),
        "corpus_bytes": sum(s["bytes"] for s in stats),
        "corpus_docs": sum(s["docs"] for s in stats),
        "doc_words_mean": float(words.mean()), "doc_words_median": float(np.median(words)),
        "doc_words_p10": float(np.percentile(words, 10)),
        "doc_words_p90": float(np.percentile(words, 90)),
        "tokens_per_word": sum(map(len, ids)) / sum(len(s.split()) for s in sample),
        "chars_per_token": sum(map(len, sample)) / sum(map(len, ids)),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return {**manifest, "reused": False}


def small_corpus(root: Path, n: int, large: list[str]) -> str:
    """A folder of links to the first n shards of `large`, named ``-of-{n}``; its glob."""
    folder = root / f"train-first{n}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for i, target in enumerate(large[:n]):
        os.symlink(os.path.relpath(target, folder),
                   folder / f"c4-train.{i:05d}-of-{n:05d}.json.gz")
    return str(folder / f"c4-train.*-of-{n:05d}.json.gz")


# ----------------------------------------------------------------------------- train.py runs

def _descendants_proc(pid: int) -> list[int]:
    """pid's descendants, from the parent ids in /proc/<pid>/stat (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Bytes of the ``Name:  N kB`` lines of a /proc file."""
    out = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in names:
                out[name] = int(rest.split()[0]) * 1024
    return out


def _memory_proc(pid: int, full: bool) -> dict:
    if full:  # smaps_rollup: Rss, Pss and the private pages (= USS), as psutil reads them
        m = _kib_fields(f"/proc/{pid}/smaps_rollup",
                        ("Rss", "Pss", "Private_Clean", "Private_Dirty"))
        return {"rss": m["Rss"], "pss": m["Pss"], "uss": m["Private_Clean"] + m["Private_Dirty"]}
    return {"rss": _kib_fields(f"/proc/{pid}/status", ("VmRSS",)).get("VmRSS", 0)}


def _memory_psutil(pid: int, full: bool) -> dict:
    import psutil

    p = psutil.Process(pid)
    if full:
        m = p.memory_full_info()
        return {"rss": m.rss, "pss": m.pss, "uss": m.uss}
    return {"rss": p.memory_info().rss}


def tree_memory(pid: int, full: bool = False, use_psutil: bool | None = None) -> dict:
    """RSS (with `full`, also PSS and USS and each process's RSS) summed over process `pid` and
    its descendants, in bytes, from psutil when it is installed (`use_psutil` None), else from
    /proc. Processes that end meanwhile are skipped."""
    if use_psutil is None:
        use_psutil = importlib.util.find_spec("psutil") is not None
    if use_psutil:
        import psutil

        try:
            pids = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pids = []
        errors: tuple = (psutil.Error, OSError)
        read = _memory_psutil
    else:
        pids = [pid] + _descendants_proc(pid)
        errors, read = (OSError, KeyError), _memory_proc
    out = {"rss": 0, "processes": 0, **({"pss": 0, "uss": 0, "rss_each": []} if full else {})}
    for p in pids:
        try:
            m = read(p, full)
        except errors:
            continue
        out["rss"] += m["rss"]
        out["processes"] += 1
        if full:
            out["pss"] += m["pss"]
            out["uss"] += m["uss"]
            out["rss_each"].append(m["rss"])  # `pid` first, then its descendants
    return out


def train_command(spec: str, valid: str, tokenizer: str, run_dir: Path, args) -> list[str]:
    return [sys.executable, "train.py", "--preset", args.preset, "--data.streaming", "true",
            "--data.corpus", spec, "--data.valid", valid, "--data.tokenizer", tokenizer,
            "--model.vocab_size", str(args.vocab_size), "--data.streams", str(args.streams),
            "--data.workers", str(args.workers), "--data.seq_len", str(args.seq_len),
            "--data.batch_size", str(args.batch), "--run.steps", str(args.steps),
            "--run.eval_batches", str(args.eval_batches), "--run.dir", str(run_dir),
            "--run.progress", "false", "--run.samples", "0", "--mesh.data", "1"]


def run_train(cmd: list[str], run_dir: Path, steps: int, timeout: float,
              poll_s: float = 0.05, sample_s: float = 0.25) -> dict:
    """Run one train.py command, watching its metrics.jsonl and its process tree's memory."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
               "PYTHONPATH", "").split(os.pathsep) if p])}
    metrics, log_path = run_dir / "metrics.jsonl", run_dir.with_suffix(".log")
    rec: dict = {"first_step_s": None, "last_step_s": None, "metrics_file_s": None}
    peak, offset, pending = 0, 0, ""
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        next_sample = 0.0
        try:
            while True:
                done = proc.poll() is not None
                now = time.perf_counter() - t0
                if metrics.is_file():
                    if rec["metrics_file_s"] is None:
                        rec["metrics_file_s"] = now
                    with open(metrics) as f:
                        f.seek(offset)
                        pending += f.read()
                        offset = f.tell()
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        m = json.loads(line)
                        if "loss" not in m:  # an evaluation's line
                            continue
                        if rec["first_step_s"] is None:
                            rec.update(first_step_s=now, first_logged_step=m["step"])
                        if m["step"] == steps and rec["last_step_s"] is None:
                            mem = tree_memory(proc.pid, full=True)
                            rec.update(last_step_s=now, rss_last_step=mem["rss"],
                                       pss_last_step=mem.get("pss"), uss_last_step=mem.get("uss"),
                                       processes_last_step=mem["processes"],
                                       rss_each_last_step=mem["rss_each"],
                                       train_tokens_per_s=m.get("tokens_per_s"))
                            peak = max(peak, mem["rss"])
                if done:
                    break
                if now >= next_sample:
                    peak = max(peak, tree_memory(proc.pid)["rss"])
                    next_sample = now + sample_s
                if now > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    raise SystemExit(f"train.py ran past --timeout {timeout:.0f} s; its output "
                                     f"is in {log_path}")
                time.sleep(poll_s)
        except BaseException:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    rec["wall_s"] = time.perf_counter() - t0
    rec["peak_rss"] = peak
    if proc.returncode != 0 or rec["first_step_s"] is None or rec["last_step_s"] is None:
        tail = log_path.read_text()[-4000:]
        raise SystemExit(f"train.py exited with {proc.returncode} (first step logged: "
                         f"{rec['first_step_s'] is not None}, step {steps} logged: "
                         f"{rec['last_step_s'] is not None}):\n{tail}")
    return rec


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


# ----------------------------------------------------------------------------- the pipeline

def pipeline_throughput(files: list[str], tokenizer: str, *, seq_len: int, batch: int,
                        streams: int, workers: int, warmup: int, batches: int, seed: int) -> dict:
    """Tokens/s of streaming_dataset alone over `batches` batches after `warmup` untimed ones,
    and the packing of those batches."""
    t0 = time.perf_counter()
    it = iter(streaming_dataset(files, seq_len=seq_len, global_batch=batch, n_streams=streams,
                                seed=seed, tokenizer=tokenizer, workers=workers))
    try:
        next(it)
        first = time.perf_counter() - t0
        for _ in range(max(warmup - 1, 0)):
            next(it)
        weight_sum, segments, rows = 0.0, 0, 0
        t1 = time.perf_counter()
        for _ in range(batches):
            b = next(it)
            if b["weights"].shape != (batch, seq_len):
                raise SystemExit(f"streaming_dataset gave a batch of shape {b['weights'].shape}, "
                                 f"expected {(batch, seq_len)}")
            weight_sum += float(b["weights"].sum(dtype=np.float64))
            segments += int(b["segment_ids"].max(axis=1).sum())  # segments are 1, 2, ... per row
            rows += batch
        seconds = time.perf_counter() - t1
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
    tokens = batches * batch * seq_len
    return {"seq_len": seq_len, "batch": batch, "streams": streams, "workers": workers,
            "warmup_batches": warmup, "batches": batches, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "first_batch_s": first,
            "weight_sum": weight_sum, "packing_efficiency": weight_sum / tokens,
            "windows": rows, "segments": segments, "segments_per_window": segments / rows}


def baseline_step(args) -> dict:
    """The real train step of the family's baseline member (bench_step.bench_member)."""
    model = depth_family(args.step_family)[args.step_layers]
    rec = bench_step.bench_member(model, seq_len=args.step_seq_len, batch=args.step_batch,
                                  steps=args.step_steps, warmup=1, mesh=MeshConfig(data=1),
                                  peak_flops=1.0,
                                  peak_source="not used")
    keep = ("n_layers", "d_model", "d_ff", "vocab_size", "compute_dtype", "seq_len", "batch",
            "steps", "compile_s", "first_call_s", "step_s_median", "step_s_mean", "step_s_min",
            "step_s_all", "tokens_per_s", "final_loss")
    return {"family": args.step_family, "params": param_count(model),
            **{k: rec[k] for k in keep}}


# ----------------------------------------------------------------------------- main

def parse(argv: list[str] | None) -> argparse.Namespace:
    p = arg_parser(__doc__)
    c = p.add_argument_group("corpus")
    c.add_argument("--shards", type=int, default=64, help="shards of the large corpus")
    c.add_argument("--shards-small", type=int, default=8, help="the small corpus: its first N")
    c.add_argument("--shard-mb", type=float, default=2.0, help="compressed MiB per shard")
    c.add_argument("--valid-mb", type=float, default=0.25, help="compressed MiB of validation")
    c.add_argument("--wikitext", default="", help="a WikiText-2 folder (wiki.train.tokens, ...);"
                                                  " default: the embedded grammar")
    c.add_argument("--pool-docs", type=int, default=12_000,
                   help="grammar documents in the pool the shards cycle over")
    c.add_argument("--doc-words", type=int, default=300, help="median words per document")
    c.add_argument("--vocab-size", type=int, default=512,
                   help="SentencePiece pieces (the tiny presets' vocabulary; the grammar's "
                        "text allows about 670)")
    c.add_argument("--tokenizer-docs", type=int, default=1000, help="documents it trains on")
    c.add_argument("--corpus", default="", help="keep the corpus here and reuse it when the "
                                               "settings match (default: a temporary folder)")
    c.add_argument("--seed", type=int, default=0)
    t = p.add_argument_group("train.py runs (time to first step, memory)")
    t.add_argument("--preset", default="tiny-L2")
    t.add_argument("--steps", type=int, default=50)
    t.add_argument("--seq-len", type=int, default=128)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--streams", type=int, default=8)
    t.add_argument("--workers", type=int, default=2, help="loader processes (train.py and (4))")
    t.add_argument("--eval-batches", type=int, default=2, help="--run.eval_batches")
    t.add_argument("--repeats", type=int, default=3, help="runs of each corpus, alternating")
    t.add_argument("--timeout", type=float, default=600, help="seconds per train.py run")
    q = p.add_argument_group("pipeline throughput and packing")
    q.add_argument("--pipe-seq-len", type=int, default=512)
    q.add_argument("--pipe-batch", type=int, default=8)
    q.add_argument("--pipe-warmup", type=int, default=10)
    q.add_argument("--pipe-batches", type=int, default=1000)
    s = p.add_argument_group("the train step it is compared with")
    s.add_argument("--step-family", default="41M")
    s.add_argument("--step-layers", type=int, default=2,
                   help="the baseline member (tests/test_config.py BASELINE_LAYERS)")
    s.add_argument("--step-seq-len", type=int, default=512)
    s.add_argument("--step-batch", type=int, default=8)
    s.add_argument("--step-steps", type=int, default=3, help="timed steps after one warm-up")
    p.add_argument("--quick", action="store_true", help="smoke run: seconds, tiny sizes")
    p.add_argument("--out", default="", help="write the JSON here (default: print only)")
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    if not 1 <= args.shards_small <= args.shards:
        raise SystemExit("--shards-small must be in [1, --shards]")
    if args.shards_small < args.streams:
        raise SystemExit(f"--shards-small {args.shards_small} < --streams {args.streams}: every "
                         f"stream needs a file")
    if min(args.repeats, args.steps, args.pipe_batches, args.step_steps) < 1:
        raise SystemExit("--repeats, --steps, --pipe-batches and --step-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    keep = bool(args.corpus)
    root = Path(args.corpus).resolve() if keep else Path(tempfile.mkdtemp(prefix="bench_data_"))
    root.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(tempfile.mkdtemp(prefix="runs_", dir=root))
    try:
        return _main(args, root, runs_dir)
    finally:
        shutil.rmtree(runs_dir if keep else root, ignore_errors=True)


def _main(args, root: Path, runs_dir: Path) -> dict:
    t0 = time.perf_counter()
    manifest = make_corpus(root, args)
    how = ("reused" if manifest["reused"] else
           "written in {:.1f} s".format(manifest["generation_s"]))
    print(f"corpus: {args.shards} shards of {manifest['shard_bytes_mean'] / 2**20:.2f} MiB "
          f"({manifest['corpus_docs']:,} documents, mean {manifest['doc_words_mean']:.0f} words; "
          f"{how}), tokenizer of {args.vocab_size} pieces", flush=True)
    large_spec = str(root / manifest["train_glob"])
    large = resolve_paths(large_spec, "data.corpus")
    small_spec = small_corpus(root, args.shards_small, large)
    valid, tok = str(root / manifest["valid"]), str(root / manifest["tokenizer"])

    runs: dict[str, list[dict]] = {"small": [], "large": []}
    for r in range(args.repeats):
        for size, spec in (("small", small_spec), ("large", large_spec)):
            run_dir = runs_dir / f"{size}-{r}"
            rec = run_train(train_command(spec, valid, tok, run_dir, args), run_dir, args.steps,
                            args.timeout)
            runs[size].append(rec)
            print(f"  train.py, {size} corpus, run {r + 1}: first step {rec['first_step_s']:.2f} s,"
                  f" step {args.steps} at {rec['last_step_s']:.2f} s, tree RSS "
                  f"{rec['rss_last_step'] / 2**20:.0f} MiB ({rec['processes_last_step']} "
                  f"processes)", flush=True)
    first = {k: median_of(v, "first_step_s") for k, v in runs.items()}
    rss = {k: median_of(v, "rss_last_step") for k, v in runs.items()}
    pss = {k: median_of(v, "pss_last_step") for k, v in runs.items()}
    peak = {k: median_of(v, "peak_rss") for k, v in runs.items()}

    pipe = pipeline_throughput(large, tok, seq_len=args.pipe_seq_len, batch=args.pipe_batch,
                               streams=args.streams, workers=args.workers,
                               warmup=args.pipe_warmup, batches=args.pipe_batches, seed=args.seed)
    print(f"  pipeline: {pipe['tokens_per_s']:,.0f} tokens/s ({args.workers} workers)", flush=True)
    step = baseline_step(args)
    print(f"  {args.step_family}-L{args.step_layers} step: {step['tokens_per_s']:,.0f} tokens/s",
          flush=True)

    ratios = {"first_step_large_over_small": first["large"] / first["small"],
              "rss_large_over_small": rss["large"] / rss["small"],
              "pss_large_over_small": pss["large"] / pss["small"],
              "peak_rss_large_over_small": peak["large"] / peak["small"],
              "pipeline_over_step": pipe["tokens_per_s"] / step["tokens_per_s"]}
    met = {"first_step": ratios["first_step_large_over_small"] <= TARGETS["first_step_ratio_max"],
           "memory": ratios["rss_large_over_small"] <= TARGETS["memory_ratio_max"],
           "pipeline_throughput": ratios["pipeline_over_step"] >= TARGETS["pipeline_over_step_min"],
           "packing": pipe["packing_efficiency"] >= TARGETS["packing_efficiency_min"]}
    out = {
        "benchmark": "bench_data", "quick": args.quick, **environment(),
        "corpus": {"shards_large": args.shards, "shards_small": args.shards_small,
                   **{k: v for k, v in manifest.items() if k not in ("train_glob", "valid",
                                                                    "tokenizer")}},
        "train": {"preset": args.preset, "steps": args.steps, "seq_len": args.seq_len,
                  "batch": args.batch, "streams": args.streams, "workers": args.workers,
                  "eval_batches": args.eval_batches, "repeats": args.repeats,
                  "timing": "from just before train.py starts to step 1's line in metrics.jsonl "
                            "(written once step 2 is dispatched); medians over --repeats",
                  "memory": "sum over train.py's process tree (grain workers included) when the "
                            "last step's line appears; peak: largest RSS sum sampled every 0.25 s",
                  "runs": runs},
        "first_step_s": first, "rss_last_step_bytes": rss, "pss_last_step_bytes": pss,
        "peak_rss_bytes": peak,
        "pipeline": pipe, "step": step, "ratios": ratios,
        "targets": TARGETS, "met": met, "total_s": time.perf_counter() - t0,
    }
    print_table(f"{'measure':<34} {'small/step':>12} {'large/pipe':>12} {'ratio':>7} "
                f"{'target':>8} {'met':>4}", [
        f"{'time to first step (s)':<34} {first['small']:>12.2f} {first['large']:>12.2f} "
        f"{ratios['first_step_large_over_small']:>7.3f} {'<= 1.2':>8} {_yes(met['first_step']):>4}",
        f"{'tree RSS at step ' + str(args.steps) + ' (MiB)':<34} {rss['small'] / 2**20:>12.0f} "
        f"{rss['large'] / 2**20:>12.0f} {ratios['rss_large_over_small']:>7.3f} {'<= 1.2':>8} "
        f"{_yes(met['memory']):>4}",
        f"{'tokens/s: step, pipeline':<34} {step['tokens_per_s']:>12,.0f} "
        f"{pipe['tokens_per_s']:>12,.0f} {ratios['pipeline_over_step']:>7.1f} {'>= 3':>8} "
        f"{_yes(met['pipeline_throughput']):>4}",
        f"{'packing efficiency':<34} {'':>12} {pipe['packing_efficiency']:>12.4f} {'':>7} "
        f"{'>= 0.99':>8} {_yes(met['packing']):>4}",
    ])
    print(f"documents per window: {pipe['segments_per_window']:.2f}")
    if args.out:
        write_json(args.out, out)
        print(f"wrote {args.out}")
    else:
        print(json.dumps(out, indent=2))
    return out


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


if __name__ == "__main__":
    main()
