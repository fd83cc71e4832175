"""Bit-identity harness: the same short train.py runs of every kind, on two source trees, and
a comparison of what they logged.

Record the runs of a jaxdepth tree (the repository root that holds train.py and jaxdepth/),
each through that tree's own train.py in a subprocess (cwd and PYTHONPATH = the tree, on the
CPU, one device, 30 steps, every step logged, an evaluation at step 15), into OUT/<run>/:

    python benchmarks/identity_runs.py --tree TREE --out OUT [--only run1,run2]
    python benchmarks/identity_runs.py --tree TREE --out OUT --started-by OLD_TREE

(the second: OLD_TREE's train.py runs each to step 15, where it checkpoints and stops, and
TREE's resumes it: what the runs and checkpoints an older tree wrote become), then compare
two such directories, one row per run:

    python benchmarks/identity_runs.py --compare OUT_A OUT_B [--all-keys]

The comparison reads OUT/<run>/metrics.jsonl and OUT/<run>/summary.json. Metric records are
matched by (step, trial, kind of record: train or eval) in file order, and every value of every
record is compared except TIMING_KEYS; every summary.json value is compared except TIMING_KEYS
and paths (PATH_KEYS, and any string that is an absolute path). Nested dicts and lists are
compared recursively; floats exactly (==, NaN equal to NaN), and a value's JSON type must match
too (1 is not 1.0). --all-keys compares the timing keys as well (to see which ones vary).

The runs and their flags are RUNS below. Some read an earlier run (prefix_lm: tiny_lm; probe:
act; the fusion runs: encoder_mlm), so --only must name those too or find them in OUT already.
The NER runs read a small WikiAnn-format directory that this script writes into OUT/_ner_data
(the same bytes for every tree, so a difference is the code's, never the data's).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

# Keys whose values are wall-clock measurements, not results: two runs of the same tree on the
# same machine differ in them (checked by comparing two recordings of one tree with --all-keys).
#   tokens_per_s, mfu: throughput of the steps since the last record (metrics.jsonl) or over the
#       run (summary.json), and the MFU computed from it;
#   peak_flops: the device peak MFU divides by, measured with a timed 1024^3 matmul at start-up
#       on a CPU (summary.json).
TIMING_KEYS = frozenset({"tokens_per_s", "mfu", "peak_flops"})

# summary.json entries that say where the run put its files: they name OUT, which differs
# between the recordings being compared. Any other string that is an absolute path (analysis,
# init_from, predictions.*) is skipped as well.
PATH_KEYS = frozenset({"run_dir", "checkpoints", "metrics", "tensorboard"})

STEPS = 30
# Every run: one CPU device, 30 steps, each step a metrics record, an evaluation mid-way (and
# the one at the end), no progress bar.
COMMON = ["--mesh.data", "1", "--run.steps", str(STEPS), "--run.log_every", "1",
          "--run.eval_every", "15", "--run.progress", "false"]
# Only LM pretraining reads these (train.py refuses a field the run's kind does not read).
# Sampling is off: it compiles programs of its own and adds minutes, not trainer coverage.
NO_SAMPLES = ["--run.samples", "0", "--run.grammar_samples", "0"]
# Encoder runs at their defaults (32 x 128, 20,000 grammar documents) take about a minute for
# 30 steps on 2 cores; these keep each well under one.
SMALL_ENCODER_DATA = ["--data.batch_size", "16", "--data.seq_len", "64",
                      "--data.grammar_docs", "2000"]
NER = ["--task.name", "ner", "--task.dir", "{ner_data}", "--task.init_from", "{encoder_mlm}",
       "--fusion.method", "dwatt", "--task.n_shot", "4", "--data.batch_size", "8",
       "--data.seq_len", "48"]

# name -> the runs it reads (made first), its train.py arguments ({run}: that run's directory,
# {ner_data}: the NER directory). Flags follow README.md and docs/*.md, shortened.
RUNS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    # the README's default run (small-L4 on the embedded grammar), 30 of its 400 steps
    "default": ((), NO_SAMPLES),
    "tiny_lm": ((), ["--preset", "tiny-L2", *NO_SAMPLES]),
    # docs/depth.md's fine-tuning command on the grammar's semantic parsing task (adamw 3e-3),
    # from tiny_lm, batch 16; 16 decoded examples per split at each evaluation
    "prefix_lm": (("tiny_lm",), [
        "--preset", "tiny-L2+finetune", "--task.name", "semantic_parsing",
        "--task.init_from", "{tiny_lm}", "--data.batch_size", "16", "--optim.name", "adamw",
        "--optim.lr", "3e-3", "--task.eval_max", "16"]),
    # docs/act.md: ACT pretraining (MLM + SOP, LAMB), then probing from its config
    "act": ((), ["--preset", "act-tiny", *SMALL_ENCODER_DATA]),
    "probe": (("act",), ["--config", "{act}/config.json", "--task.name", "roles",
                         "--task.init_from", "{act}"]),
    # the bert-tiny preset: M = 6 untied layers, MLM + SOP (encoder_pretrain)
    "bert": ((), ["--preset", "bert-tiny", *SMALL_ENCODER_DATA]),
    # docs/fusion.md's BERT encoder MLM pretraining (the README's runs/bert-mini); the fusion
    # runs below read it, as the documented fusion commands do: fusion MLM needs this encoder's
    # tied word embeddings (it refuses the bert run's untied ALBERT-style encoder)
    "encoder_mlm": ((), ["--model.arch", "encoder", "--optim.lr", "1e-3",
                         *SMALL_ENCODER_DATA]),
    "ner_fe": (("encoder_mlm",), [*NER, "--fusion.mode", "fe"]),
    # docs/fusion.md's fine-tuning recipe (lr 5e-5, linear decay to 0, no warmup)
    "ner_ft": (("encoder_mlm",), [
        *NER, "--fusion.mode", "ft", "--optim.lr", "5e-5", "--optim.schedule", "linear",
        "--optim.min_lr_ratio", "0", "--optim.warmup_steps", "0"]),
    "fusion_mlm": (("encoder_mlm",), [
        "--task.name", "mlm", "--task.init_from", "{encoder_mlm}", "--fusion.method", "concat",
        "--data.batch_size", "8", "--data.seq_len", "64", "--data.grammar_docs", "2000"]),
    # trials: three seeds side by side in one compiled program
    "lm_trials3": ((), ["--preset", "tiny-L2", *NO_SAMPLES, "--run.seeds", "0,1,2"]),
    "ner_fe_trials3": (("encoder_mlm",), [*NER, "--fusion.mode", "fe", "--run.seeds", "0,1,2"]),
}


# ----------------------------------------------------------------------------- NER data

# WikiAnn-format sentences from templates (as tests/tasks/test_ner_job.py writes them): the
# tree's tests/fixtures/ner/wikiann_en.txt has two sentences and no splits, too few for a
# few-shot sample of 4 per entity type.
_ENTITIES = {"PER": [["John"], ["Mary"], ["Anna", "Smith"], ["Peter", "Lopez"], ["Ravi"]],
             "LOC": [["Paris"], ["Berlin"], ["New", "York"], ["Kenya"], ["Oslo"]],
             "ORG": [["Google"], ["Siemens"], ["Red", "Cross"], ["Nokia"], ["UNESCO"]]}
_TEMPLATES = [["PER", "visited", "LOC", "."],
              ["PER", "works", "for", "ORG", "in", "LOC", "."],
              ["the", "ORG", "office", "opened", "in", "LOC", "."],
              ["ORG", "hired", "PER", "yesterday", "."],
              ["we", "met", "PER", "and", "PER", "near", "LOC", "."]]


def write_ner_data(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", 40, 0), ("dev", 10, 1), ("test", 10, 2)):
        rng = random.Random(seed)  # random.Random's draws are stable across Python versions
        sentences = []
        for _ in range(n):
            lines = []
            for part in rng.choice(_TEMPLATES):
                if part in _ENTITIES:
                    words = rng.choice(_ENTITIES[part])
                    tags = [f"B-{part}"] + [f"I-{part}"] * (len(words) - 1)
                else:
                    words, tags = [part], ["O"]
                lines += [f"en:{w}\t{t}" for w, t in zip(words, tags)]
            sentences.append("\n".join(lines))
        (d / split).write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    return d


# ----------------------------------------------------------------------------- recording

def subprocess_env(tree: Path) -> dict:
    env = dict(os.environ)
    # Inherited XLA/JAX settings (XLA_FLAGS, a compilation cache, x64, ...) could change what
    # is compiled or computed: both trees run under JAX's defaults instead.
    for k in list(env):
        if k.startswith(("XLA_", "JAX_")):
            del env[k]
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(tree)  # that tree's jaxdepth, not the installed one
    return env


def _children_cpu() -> float:
    # CPU seconds of finished subprocesses: with wall time, shows how loaded the machine was
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def command(tree: Path, out: Path, name: str) -> list[str]:
    args = RUNS[name][1]
    fill = {d: str(out / d) for d in RUNS}
    fill["ner_data"] = str(out / "_ner_data")
    args = [a.format(**fill) for a in args]
    return [sys.executable, str(tree / "train.py"), *args, *COMMON, "--run.dir", str(out / name)]


def _train(tree: Path, cmd: list[str], log: Path) -> int:
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=tree, env=subprocess_env(tree), stdout=f,
                              stderr=subprocess.STDOUT).returncode


def record(tree: Path, out: Path, names: list[str], started_by: Path | None = None) -> int:
    """Each run by `tree`; with `started_by` (another tree), that tree's train.py runs it to
    step STEPS // 2 (run.stop_after, a checkpoint there) and `tree`'s resumes it to STEPS:
    its records and summary are then compared with an uninterrupted recording."""
    tree, out = tree.resolve(), out.resolve()
    for t in (tree, started_by):
        if t is not None and not ((t / "train.py").is_file() and (t / "jaxdepth").is_dir()):
            sys.exit(f"{t}: not a jaxdepth tree (no train.py and jaxdepth/)")
    out.mkdir(parents=True, exist_ok=True)
    write_ner_data(out / "_ner_data")
    log_path = out / "runs.json"
    log = json.loads(log_path.read_text()) if log_path.is_file() else {}
    log["tree"] = str(tree)
    if started_by is not None:
        log["started_by"] = str(started_by.resolve())
    failed = []
    for name in names:
        run_dir = out / name
        # an existing run directory would be resumed (or found finished), not run again
        if run_dir.exists() and any(run_dir.iterdir()):
            print(f"{name}: {run_dir} is not empty: remove it to run it again", flush=True)
            failed.append(name)
            continue
        missing = [d for d in RUNS[name][0] if not (out / d / "summary.json").is_file()]
        if missing:
            print(f"{name}: skipped, needs the run(s) {', '.join(missing)} in {out}", flush=True)
            failed.append(name)
            continue
        cmd = command(tree, out, name)
        run_dir.mkdir(parents=True, exist_ok=True)
        t0, c0 = time.perf_counter(), _children_cpu()
        rc = 0
        if started_by is not None:
            first = command(started_by.resolve(), out, name)
            rc = _train(started_by, [*first, "--run.stop_after", str(STEPS // 2)],
                        run_dir / "train.log")
        if rc == 0:
            rc = _train(tree, cmd, run_dir / "train.log")
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        # train.py writes both files into its run directory, which is OUT/<name> itself
        have = all((run_dir / f).is_file() for f in ("metrics.jsonl", "summary.json"))
        ok = rc == 0 and have
        log[name] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "rc": rc, "ok": ok,
                     "command": ["python", "train.py", *cmd[2:]]}
        log_path.write_text(json.dumps(log, indent=1) + "\n")
        status = "ok" if ok else f"FAILED (exit {rc}; see {run_dir / 'train.log'})"
        print(f"{name}: {wall:.1f} s wall, {cpu:.1f} s CPU {status}", flush=True)
        if not ok:
            failed.append(name)
    return 1 if failed else 0


# ----------------------------------------------------------------------------- comparison

def _same_leaf(a, b) -> bool:
    if type(a) is not type(b):  # 1 vs 1.0, or a number turned into a string, is a change
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _is_path(key, value) -> bool:
    return isinstance(value, str) and (key in PATH_KEYS or os.path.isabs(value))


def diff(a, b, where: str, skip: frozenset, paths: bool, found: list) -> int:
    """Append every difference between a and b to found, as (key, message); return the number
    of leaf values compared. skip: keys left out at any depth; paths: leave out path values."""
    if isinstance(a, dict) and isinstance(b, dict):
        n = 0
        for k in [*a, *(k for k in b if k not in a)]:
            if k in skip or (paths and (_is_path(k, a.get(k)) or _is_path(k, b.get(k)))):
                continue
            if k not in a or k not in b:
                found.append((k, f"{where}{k}: only in {'B' if k in b else 'A'}"))
                continue
            n += diff(a[k], b[k], f"{where}{k}.", skip, paths, found)
        return n
    where = where.rstrip(".")
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            found.append((_key(where), f"{where}: {len(a)} items vs {len(b)}"))
        return sum(diff(x, y, f"{where}[{i}].", skip, paths, found)
                   for i, (x, y) in enumerate(zip(a, b)))
    if not _same_leaf(a, b):
        found.append((_key(where), f"{where}: {a!r} vs {b!r}"))
    return 1


def record_kind(rec: dict) -> str:
    # a training record carries the step's loss; an evaluation record does not
    return "train" if "loss" in rec else "eval"


def keyed_records(path: Path) -> dict[tuple, dict]:
    """(step, trial, kind, n: the n-th record of that step, trial and kind in the file) ->
    the record."""
    out, seen = {}, {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            key = (rec.get("step"), rec.get("trial"), record_kind(rec))
            seen[key] = seen.get(key, 0) + 1
            out[(*key, seen[key])] = rec
    return out


def _key(where: str) -> str:
    """The innermost dict key of a location such as "summary: table1.tokens.all" or
    "summary: cosine[4]"."""
    return where.rpartition(": ")[2].split(".")[-1].split("[")[0]


def compare_run(a: Path, b: Path, skip: frozenset, by_key: dict) -> tuple[str, str, str, str]:
    """(metric records compared, summary values compared, identical?, first difference); adds
    the number of differing values per key to by_key."""
    for d in (a, b):
        for f in ("metrics.jsonl", "summary.json"):
            if not (d / f).is_file():
                return "-", "-", "NO", f"{d / f} is missing"
    found: list[tuple[str, str]] = []
    ma, mb = keyed_records(a / "metrics.jsonl"), keyed_records(b / "metrics.jsonl")
    n_rec = n_metric = 0
    for key in [*ma, *(k for k in mb if k not in ma)]:
        step, trial, kind, nth = key
        label = (f"metrics step {step}" + ("" if trial is None else f" trial {trial}")
                 + f" {kind}" + ("" if nth == 1 else f" #{nth}") + ": ")
        if key not in ma or key not in mb:
            found.append(("(record)", f"{label}record only in {'B' if key in mb else 'A'}"))
            continue
        n_rec += 1
        n_metric += diff(ma[key], mb[key], label, skip, False, found)
    n_summary = diff(json.loads((a / "summary.json").read_text()),
                     json.loads((b / "summary.json").read_text()), "summary: ", skip, True, found)
    for k, _ in found:
        by_key[k] = by_key.get(k, 0) + 1
    first = "" if not found else found[0][1] + (f" (and {len(found) - 1} more)" if found[1:]
                                                else "")
    return (f"{n_rec} ({n_metric} values)", str(n_summary), "yes" if not found else "NO",
            first.replace("|", "\\|"))


def compare(a: Path, b: Path, all_keys: bool) -> int:
    skip = frozenset() if all_keys else TIMING_KEYS
    names = [n for n in RUNS if (a / n).is_dir() or (b / n).is_dir()]
    print(f"A: {a}\nB: {b}\nskipped keys: "
          f"{', '.join(sorted(skip)) or 'none'}; summary paths: {', '.join(sorted(PATH_KEYS))} "
          f"and absolute paths\n")
    print("| run | metric records compared | summary values compared | identical? | "
          "first difference |")
    print("| --- | ---: | ---: | :---: | --- |")
    bad, by_key = 0, {}
    for name in names:
        row = compare_run(a / name, b / name, skip, by_key)
        bad += row[2] != "yes"
        print(f"| {name} | " + " | ".join(row) + " |")
    print(f"\n{len(names) - bad} of {len(names)} runs identical")
    if by_key:  # with --all-keys on two recordings of one tree: the timing keys
        print("differing values by key: "
              + ", ".join(f"{k} {n}" for k, n in sorted(by_key.items())))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="runs: " + ", ".join(RUNS))
    p.add_argument("--tree", type=Path, help="a jaxdepth source tree (holds train.py, jaxdepth/)")
    p.add_argument("--out", type=Path, help="where the runs go: OUT/<run>/")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    p.add_argument("--started-by", type=Path, metavar="TREE",
                   help="record: TREE runs each run to step 15 (a checkpoint there), then "
                        "--tree resumes it: compare with an uninterrupted recording")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                   help="compare two --out directories; prints a markdown table")
    p.add_argument("--all-keys", action="store_true",
                   help="with --compare: compare TIMING_KEYS too")
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare, all_keys=args.all_keys)
    if args.tree is None or args.out is None:
        p.error("give --tree and --out (record), or --compare A B")
    names = [n for n in args.only.split(",") if n] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        p.error(f"unknown run(s) {', '.join(unknown)}; runs: {', '.join(RUNS)}")
    return record(args.tree, args.out, names, args.started_by)


if __name__ == "__main__":
    sys.exit(main())
