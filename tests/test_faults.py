"""Faults and bad input against train.py and eval.py: each case is a clean recovery, or one
line naming the file (and line) with exit code 2 (jaxdepth/errors.py), and no checkpoint is
lost. The "What happens when…" table of docs/faults.md lists the same cases.

Runs are tiny (tiny-L2, 32-token windows, batches of 8, one device) and in-process where the
case allows; a subprocess only where the case needs a process of its own: a lock held by
another PID, a file size limit standing in for a full disk (RLIMIT_FSIZE makes a write fail
with EFBIG where a full disk gives ENOSPC: the same failed write, without needing a small
filesystem), a process killed with SIGKILL.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _train_helpers import (GRAMMAR_DOCS, REPO, TRAIN_PY, committed_steps, flags, load_state,
                            read_by_kind, snapshot, step_losses, subprocess_env)
from jaxdepth.config import Config, ConfigError, DataConfig, MeshConfig, ModelConfig
from jaxdepth.data.embedded import grammar

STEPS = 10  # the finished run: checkpoints at 5 and 10
TIMEOUT = 240


def argv(run, tokenizer, steps: int = STEPS, **fields) -> list[str]:
    """A tiny-L2 run on one device, a checkpoint every 5 steps, every step logged."""
    args = {"run.dir": run, "run.steps": steps, "run.save_every": 5, "run.log_every": 1,
            "run.eval_every": 1000, "run.progress": "false", "run.samples": 0,
            "run.grammar_samples": 0, "data.grammar_docs": GRAMMAR_DOCS, "data.seq_len": 32,
            "data.batch_size": 8, "data.tokenizer": tokenizer, "mesh.data": 1}
    return flags(["--preset", "tiny-L2"], read_by_kind(["--preset", "tiny-L2"], args, fields))


def call(main, args, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, code: int, *needles: str, want: int = 2) -> str:
    """The error line of a failed run: exit code `want`, one `error:` line, no traceback."""
    assert code == want, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer, train_main):
    """A finished 10-step run (checkpoints 5 and 10) and the loss of each of its steps."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert train_main([str(a) for a in argv(run, tokenizer)]) == 0
    assert committed_steps(run) == [5, 10]
    return run, {s: v[0] for s, v in step_losses(run).items()}


def unlocked_snapshot(run: Path) -> dict:
    """Every file of a run but the lock file, which the run that takes the lock rewrites."""
    return {k: v for k, v in snapshot(run).items() if k != ".lock"}


def copy_run(finished, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)  # copy2 keeps mtimes: snapshots compare equal
    return run


def run_subprocess(args, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """train.py in a process of its own; limit_bytes: the largest file it may write (Python
    ignores SIGXFSZ, so a write past the limit fails with EFBIG)."""
    # The limit is set by the child itself: a preexec_fn would fork this multithreaded process.
    run = ("import resource, runpy, sys\n"
           f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes}))\n"
           f"sys.argv = sys.argv[1:]\nrunpy.run_path({str(TRAIN_PY)!r}, run_name='__main__')")
    command = [sys.executable, *(["-c", run] if limit_bytes else []), str(TRAIN_PY)]
    return subprocess.run([*command, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          env=subprocess_env(), timeout=TIMEOUT)


# ----------------------------------------------------------------------------- 1. checkpoints

def _largest_state_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


# A restore that fails on a corrupt file leaves Orbax's other read coroutines un-awaited; Python
# reports each when it is collected (train.py and eval.py keep them off the terminal).
orbax_leftovers = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CORRUPTIONS = {
    "truncated": lambda d: os.truncate(_largest_state_file(d), 10),
    "bit_flipped": lambda d: _flip_middle_byte(_largest_state_file(d)),
    "state_deleted": lambda d: shutil.rmtree(d / "state"),
    "metadata_deleted": lambda d: (d / "state" / "_METADATA").unlink(),
    "data_state_deleted": lambda d: (d / "data" / "process_0-of-1.json").unlink(),
}


@orbax_leftovers
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_unreadable_latest_checkpoint_is_moved_aside_and_the_run_resumes(
        finished, tmp_path, tokenizer, train_main, capsys, corruption):
    run = copy_run(finished, tmp_path)
    CORRUPTIONS[corruption](run / "checkpoints" / "10")
    corrupt = snapshot(run / "checkpoints" / "10")
    logged_before = len(step_losses(run)[6])

    code, out, err = call(train_main, argv(run, tokenizer), capsys)
    assert code == 0, err[-3000:]
    assert f"warning: checkpoint 10 in {run / 'checkpoints'} is unreadable" in err
    assert f"moved to {run / 'checkpoints-corrupt' / '10'}; resuming from step 5" in err
    # kept as it was for inspection, never deleted; the run went on from step 5 bit for bit
    assert snapshot(run / "checkpoints-corrupt" / "10") == corrupt
    assert committed_steps(run) == [5, 10]
    again = step_losses(run)
    assert all(len(again[s]) == logged_before + 1 and again[s][-1] == finished[1][s]
               for s in range(6, STEPS + 1))
    assert "finished step 10" in out


@orbax_leftovers
def test_no_readable_checkpoint_is_one_line_and_moves_nothing(finished, tmp_path, tokenizer,
                                                              train_main, capsys):
    run = copy_run(finished, tmp_path)
    for step in (5, 10):
        shutil.rmtree(run / "checkpoints" / str(step) / "state")
    before = unlocked_snapshot(run)
    code, _, err = call(train_main, argv(run, tokenizer), capsys)
    one_line_error(err, code, f"no readable checkpoint in {run / 'checkpoints'}", "step 10:",
                   "step 5:", "to start afresh")
    assert unlocked_snapshot(run) == before and not (run / "checkpoints-corrupt").exists()


@orbax_leftovers
def test_eval_skips_an_unreadable_checkpoint_without_moving_it(finished, tmp_path, eval_main,
                                                               capsys):
    run = copy_run(finished, tmp_path)
    shutil.rmtree(run / "checkpoints" / "10" / "state")
    checkpoints = snapshot(run / "checkpoints")
    code, out, err = call(eval_main, ["--run", run], capsys)
    assert code == 0, err[-3000:]
    assert json.loads(out)["step"] == 5
    assert f"checkpoint 10 in {run / 'checkpoints'} is unreadable" in err and "using step 5" in err
    assert snapshot(run / "checkpoints") == checkpoints
    # the unreadable one named explicitly: one line, the other steps listed
    code, _, err = call(eval_main, ["--run", run, "--step", 10], capsys)
    one_line_error(err, code, "no readable checkpoint", "step 10:", "the other steps there: [5]")


def test_eval_on_a_run_without_a_checkpoint(tmp_path, eval_main, capsys):
    (tmp_path / "checkpoints").mkdir()
    code, _, err = call(eval_main, ["--run", tmp_path], capsys)
    one_line_error(err, code, f"no complete checkpoint in {tmp_path / 'checkpoints'}")


def test_eval_on_a_config_of_an_unknown_layout_names_the_file(tmp_path, eval_main, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"version": 999}))
    code, _, err = call(eval_main, ["--run", tmp_path], capsys)
    assert one_line_error(err, code, "") == (
        f"config error: {tmp_path / 'config.json'}: version: must be 1, 2, 3, 4 or 5, got 999")


@pytest.mark.fake_devices
def test_a_flipped_bit_anywhere_is_caught_by_the_fingerprints():
    from jaxdepth.trainer.checkpoint import fingerprints, mismatches

    tree = {"w": jnp.arange(64, dtype=jnp.float32).reshape(8, 8) / 7,
            "b": jnp.ones((3,), jnp.bfloat16), "step": jnp.int32(5)}
    saved = fingerprints(tree)
    for bit in (0, 17, 31):  # mantissa, exponent, sign
        bits = np.asarray(tree["w"]).view(np.uint32).copy()
        bits[3, 5] ^= np.uint32(1 << bit)
        flipped = {**tree, "w": jnp.asarray(bits.view(np.float32))}
        assert mismatches(flipped, saved) == ["['w']"]
    # two values swapped: the same multiset of bits, another position
    w = np.asarray(tree["w"]).copy()
    w[0, 0], w[0, 1] = w[0, 1], w[0, 0]
    assert mismatches({**tree, "w": jnp.asarray(w)}, saved) == ["['w']"]
    # the fingerprint does not depend on the sharding the array is saved from
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    sharded = jax.device_put(tree["w"], jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec("data", "model")))
    assert fingerprints({**tree, "w": sharded}) == saved


# ----------------------------------------------------------------------------- 2. run lock

def test_a_second_process_on_a_run_directory_exits_naming_the_holder(finished, tmp_path,
                                                                    tokenizer):
    from jaxdepth.trainer.run_lock import run_lock

    run = copy_run(finished, tmp_path)
    with run_lock(run):  # this process holds it, as a first train.py would
        before = snapshot(run)
        res = run_subprocess(argv(run, tokenizer, 20))
        after = snapshot(run)
    one_line_error(res.stderr, res.returncode, f"{run} is in use by process {os.getpid()}",
                   "another --run.dir")
    assert after == before


def test_the_lock_dies_with_its_process(tmp_path):
    from jaxdepth.trainer.run_lock import RunDirectoryInUse, run_lock

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path\n"
         "from jaxdepth.trainer.run_lock import run_lock\n"
         f"with run_lock(Path({str(tmp_path)!r})):\n"
         "    print('locked', flush=True); sys.stdin.read()"],
        cwd=REPO, env=subprocess_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryInUse, match=f"in use by process {holder.pid}"):
            with run_lock(tmp_path):
                pass
    finally:
        holder.kill()  # SIGKILL: no clean-up runs in the holder
        holder.communicate(timeout=30)
    assert holder.returncode == -9
    with run_lock(tmp_path):  # the OS released it; the stale PID in the file does not matter
        assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())


# ----------------------------------------------------------------------------- 3. config files

@pytest.mark.parametrize("text, line, message", [
    ('{"run": {"steps": "abc"}}', 1, 'run.steps: must be an integer, got "abc"'),
    ('{\n  "model": 5\n}', 2, "model: must be a JSON object of fields, got 5"),
    ('{\n  "optim": {"lr": 1e-3},\n  "run": {\n    "steps": 20.7\n  }\n}', 4,
     "run.steps: must be an integer, got 20.7"),
    ('{"run": {"progress": 1}}', 1, "run.progress: must be true or false, got 1"),
    ('{"optim": {"lr": true}}', 1, "optim.lr: must be a number, got true"),
    ('{"run": {"steps": 10,}}', 1, "not valid JSON"),
])
def test_config_file_values_are_type_checked(tmp_path, train_main, capsys, text, line, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    code, _, err = call(train_main, ["--config", path, "--run.dir", tmp_path / "run"], capsys)
    one_line_error(err, code, f"config error: {path}:{line}: {message}")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_debug_adds_the_traceback_and_bugs_still_raise(tmp_path, train_main, capsys):
    from jaxdepth.errors import run_main

    path = tmp_path / "config.json"
    path.write_text('{"run": {"steps": "abc"}}')
    code, _, err = call(train_main, ["--config", path, "--debug"], capsys)
    assert code == 2 and "Traceback" in err
    assert err.rstrip().splitlines()[-1].startswith(f"config error: {path}:1: run.steps")

    def bug() -> int:
        raise KeyError("not the user's doing")

    with pytest.raises(KeyError):
        run_main(bug, debug=False)


def test_an_integer_is_a_valid_float_in_a_config_file(tmp_path):
    from jaxdepth.config.cli import parse_args

    path = tmp_path / "config.json"
    path.write_text('{"optim": {"lr": 1}}')
    lr = parse_args(["--config", str(path)]).optim.lr
    assert lr == 1.0 and isinstance(lr, float)


# ----------------------------------------------------------------------------- 4, 5. input files

def _gzip_truncated(path: Path, text: str) -> Path:
    data = gzip.compress(text.encode())
    path.write_bytes(data[: len(data) // 2])
    return path


def _documents(n: int = 60) -> list[str]:
    return grammar.corpus_texts(n, seed=3)


@pytest.mark.parametrize("name", ["corpus.txt.gz", "corpus.jsonl.gz"])
def test_truncated_gzip_corpus(tmp_path, tokenizer, train_main, capsys, name):
    docs = _documents()
    text = ("\n".join(json.dumps({"text": d}) for d in docs) if "jsonl" in name
            else "\n\n".join(docs))
    path = _gzip_truncated(tmp_path / name, text)
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{"data.corpus": path}), capsys)
    one_line_error(err, code, f"{path}: truncated or corrupt gzip file")


@pytest.mark.parametrize("suffix, line, column", [(".txt", 7, 3), (".jsonl", 4, 12)])
def test_a_byte_that_is_not_utf8_is_named_with_file_line_and_column(tmp_path, train_main, capsys,
                                                                   suffix, line, column):
    docs = _documents()
    lines = ("\n\n".join(docs) if suffix == ".txt"
             else "\n".join(json.dumps({"text": d}) for d in docs)).encode().split(b"\n")
    lines[line - 1] = lines[line - 1][:column - 1] + b"\xff" + lines[line - 1][column - 1:]
    path = tmp_path / f"corpus{suffix}"
    path.write_bytes(b"\n".join(lines))
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{"data.corpus": path}), capsys)
    one_line_error(err, code, f"{path}:{line}: not UTF-8 text (byte 0xff at column {column})")


def _task_dir(tmp_path, **files) -> Path:
    """A COGS-format task directory; files: split -> bytes (default: three good lines)."""
    d = tmp_path / "cogs"
    d.mkdir()
    good = b"a cat ran .\t* cat ( x _ 1 ) ; run . agent ( x _ 2 , x _ 1 )\tin_distribution\n" * 3
    for split in ("train", "dev", "test", "gen"):
        (d / f"{split}.tsv").write_bytes(files.get(split, good))
    return d


@pytest.mark.parametrize("split, content, message", [
    ("train", b"a cat .\tlf\tin_distribution\na \xffdog .\tlf\tin_distribution\n",
     "train.tsv:2: not UTF-8 text (byte 0xff at column 3)"),
    ("train", b"", "train.tsv: empty file (no examples)"),
    ("dev", b"\n", "dev.tsv: empty file (no examples)"),
])
def test_task_files_are_named_in_errors(tmp_path, train_main, capsys, split, content, message):
    d = _task_dir(tmp_path, **{split: content})
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{
        "task.name": "cogs", "task.dir": d, "model.vocab_size": 64}), capsys)
    one_line_error(err, code, f"{d}/{message}")


def test_an_empty_directory_given_as_the_corpus(tmp_path, train_main, capsys):
    """A directory stands for the files in it (docs/data.md); one without any is named."""
    empty = tmp_path / "corpus"
    empty.mkdir()
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{"data.corpus": empty}),
                        capsys)
    one_line_error(err, code, f"data.corpus: directory {empty} holds no file")


def test_a_vocabulary_too_small_for_the_corpus(tmp_path, train_main, capsys):
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{"model.vocab_size": 4}),
                        capsys)
    one_line_error(err, code, "model.vocab_size=4 is too small for the embedded grammar corpus",
                   "need at least")


def test_a_corpus_of_lines_too_long_for_the_tokenizer(tmp_path, train_main, capsys):
    path = tmp_path / "one_line.txt"
    path.write_text(" ".join(["alpha", "beta", "gamma", "delta"] * 4000))  # 80 KB, one line
    code, _, err = call(train_main, argv(tmp_path / "run", "", **{"data.corpus": path,
                                                                   "model.vocab_size": 40}),
                        capsys)
    one_line_error(err, code, f"cannot train a tokenizer on data.corpus {path}",
                   "every line is longer than 65,536 bytes")


def test_a_full_disk_while_preparing_data_leaves_no_partial_file(tmp_path):
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 7))) for _ in range(300)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(rng.choice(words, 12)) + " ." for _ in range(8000)))
    run = tmp_path / "run"
    # the tokenizer (~0.1 MB) fits under the limit, the token stream (~0.4 MB) does not
    res = run_subprocess(argv(run, "", 2, **{"data.corpus": corpus, "model.vocab_size": 64}),
                         limit_bytes=300_000)
    one_line_error(res.stderr, res.returncode, f"file too large: {run / 'data' / 'train.npy'}")
    assert (run / "data" / "tokenizer.model").is_file()
    assert not list((run / "data").glob("train.npy*"))


@pytest.mark.parametrize("name", ["config.json", "summary.json"])
def test_a_file_too_large_to_write_leaves_the_one_before(tmp_path, name):
    """config.json and summary.json (what eval.py and the experiments read) are written whole
    or not at all: a write the file-size limit cuts short (a full disk's ENOSPC in EFBIG's
    place) raises naming the file, and leaves the file that was there, without a temporary
    one beside it."""
    script = f"""
import resource, sys
from pathlib import Path
from jaxdepth.files import write_whole
path = Path(sys.argv[1]) / {name!r}
write_whole(path, '{{"old": 1}}')
resource.setrlimit(resource.RLIMIT_FSIZE, (500, 500))
try:
    write_whole(path, '{{"new": "' + 'x' * 5000 + '"}}')
except OSError as e:
    print(e.strerror, e.filename)
"""
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, env=subprocess_env(), timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == f"File too large {tmp_path / name}"
    assert (tmp_path / name).read_text() == '{"old": 1}'
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_a_run_directory_that_cannot_be_created(tmp_path, train_main, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, _, err = call(train_main, argv(blocker / "run", ""), capsys)
    one_line_error(err, code, f"not a directory: {blocker / 'run'}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to a read-only directory")
def test_a_read_only_run_directory(finished, tmp_path, tokenizer, train_main, capsys):
    run = copy_run(finished, tmp_path)
    run.chmod(0o555)
    try:
        code, _, err = call(train_main, argv(run, tokenizer, 20), capsys)
    finally:
        run.chmod(0o755)
    one_line_error(err, code, "permission denied:", str(run))


# ----------------------------------------------------------------------------- 6. async saves

def test_a_failed_asynchronous_save_stops_the_run_and_keeps_the_previous_checkpoint(
        finished, tmp_path, tokenizer):
    run = copy_run(finished, tmp_path)
    kept = snapshot(run / "checkpoints")
    # However TensorStore splits the state over files (it varies with its thread pool), a file
    # holding the 128 KiB embedding table or one of its Adam moments exceeds 100 kB, so the save
    # of step 15 cannot be written; config, metrics and checkpoint metadata stay far below.
    res = run_subprocess(argv(run, tokenizer, 20), limit_bytes=100_000)
    line = one_line_error(res.stderr, res.returncode,
                          f"file too large while saving step 15 to {run / 'checkpoints' / '15'}",
                          "the checkpoint of step 10 is intact")
    stopped = int(line.split("training stopped at step ")[1].split(";")[0])
    assert 15 <= stopped <= 20 and max(step_losses(run)) == stopped
    assert committed_steps(run) == [5, 10]
    assert {k: v for k, v in snapshot(run / "checkpoints").items()
            if k.split("/")[0] in ("5", "10")} == kept
    assert load_state(run, 10)[0] == 10


# ----------------------------------------------------------------------------- 7-9. summary, steps

def test_summary_is_complete_after_a_kill_between_the_last_checkpoint_and_the_summary(
        finished, tmp_path, tokenizer, train_main, capsys):
    run = copy_run(finished, tmp_path)
    want = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()  # what a kill there leaves
    code, _, err = call(train_main, argv(run, tokenizer), capsys)
    assert code == 0, err[-3000:]
    got = json.loads((run / "summary.json").read_text())
    assert got["train_loss"] == want["train_loss"] == finished[1][STEPS]
    assert got["tokens_per_s"] == pytest.approx(want["tokens_per_s"], rel=1e-9)
    assert got["mfu"] == pytest.approx(
        got["tokens_per_s"] * got["flops_per_token"] / (got["peak_flops"] * got["devices"]))
    assert got["valid_loss"] == want["valid_loss"]


def test_steps_below_the_checkpoint_are_refused(finished, tmp_path, tokenizer, train_main,
                                                capsys):
    run = copy_run(finished, tmp_path)
    before = unlocked_snapshot(run)
    code, _, err = call(train_main, argv(run, tokenizer, 7), capsys)
    one_line_error(err, code, "config error: run.steps: 7 is below step 10 of the latest "
                              f"checkpoint in {run / 'checkpoints'}")
    assert unlocked_snapshot(run) == before  # config.json keeps run.steps 10


def test_stop_after_saves_where_it_stops_and_the_rest_resumes_bit_for_bit(
        finished, tmp_path, tokenizer, train_main, capsys):
    run = tmp_path / "run"
    code, out, err = call(train_main, argv(run, tokenizer, **{"run.stop_after": 9}), capsys)
    assert code == 0, err[-3000:]
    assert "stopped at step 9 (run.stop_after), checkpoint of step 9 saved" in out
    assert committed_steps(run) == [5, 9] and not (run / "summary.json").exists()
    # the same command without the stop: one step left, its throughput is not measured in
    # this invocation, and the summary takes it from the first invocation's metrics.jsonl
    code, _, err = call(train_main, argv(run, tokenizer), capsys)
    assert code == 0, err[-3000:]
    assert {s: v[-1] for s, v in step_losses(run).items()} == finished[1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_loss"] == finished[1][STEPS]
    assert summary["tokens_per_s"] > 0 and summary["mfu"] > 0


# ----------------------------------------------------------------------------- smaller defects

def test_readers_restore_the_model_only(finished):
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer import checkpoint as ckpt, restore as rs
    from jaxdepth.optim import make_optimizer
    from jaxdepth.trainer.sharding import make_mesh
    from jaxdepth.trainer.state import state_shardings

    run = finished[0]
    model, cfg, step = rs.load_model(run, task_for)
    assert step == STEPS
    _, full = load_state(run, STEPS)
    for x, y in zip(jax.tree.leaves(full.model), jax.tree.leaves(model)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    mngr = ckpt.open_manager(run, read_only=True)
    try:
        mesh = make_mesh(MeshConfig(data=1))
        state = rs._restore_model(mngr, STEPS, *state_shardings(
            [cfg], make_optimizer(cfg.optim, cfg.run.steps), mesh, task_for(cfg)))
    finally:
        mngr.close()
    assert all(leaf is Ellipsis for leaf in jax.tree.leaves(state.opt_state))  # never read


def test_fine_tuning_accepts_n_heads_spelled_out(finished):
    from jaxdepth.tasks.prefix_lm import load_pretrained
    from jaxdepth.trainer.sharding import make_mesh

    run = finished[0]
    saved = Config.from_dict(json.loads((run / "config.json").read_text()))
    assert saved.model.n_heads == 0 and saved.model.heads == 1  # automatic: d_model 64 / 64

    def fine_tuning(n_heads: int) -> Config:
        d = saved.to_dict()
        return Config.from_dict({**d, "model": {**d["model"], "n_heads": n_heads},
                                 "task": {"name": "semantic_parsing", "init_from": str(run)}})

    mesh = make_mesh(MeshConfig(data=1))
    _, step = load_pretrained(fine_tuning(1), mesh)
    assert step == STEPS
    with pytest.raises(ConfigError, match="model.n_heads: 2 here but 1"):
        load_pretrained(fine_tuning(2), mesh)


@pytest.mark.fake_devices
def test_silent_fallbacks_now_warn(monkeypatch, capsys):
    from jaxdepth.models.decoder import DecoderLM
    from jaxdepth.trainer import sharding

    monkeypatch.setattr(sharding, "_warned", set())
    mesh = sharding.make_mesh(MeshConfig(data=-1, model=3))  # 8 devices: 2 x 3
    assert mesh.size == 6
    assert "mesh.data=-1 uses 6 of the 8 devices" in capsys.readouterr().err
    model = eqx.filter_eval_shape(
        DecoderLM, ModelConfig(vocab_size=96, d_model=64, n_layers=2, d_ff=97),
        key=jax.random.key(0))
    sharding.param_shardings(model, sharding.make_mesh(MeshConfig(data=4, model=2)), False)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "mlp.wi_0 dim 2 (97 over model=2)" in err
    sharding.param_shardings(model, sharding.make_mesh(MeshConfig(data=4, model=2)), False)
    assert capsys.readouterr().err == ""  # once per process


def test_a_source_head_that_does_not_fit_is_named(monkeypatch, capsys):
    from jaxdepth.tasks import backbones, task_for

    cfg = Config.from_dict({
        "model": {"arch": "encoder", "vocab_size": 64, "d_model": 32, "n_layers": 2, "d_ff": 64,
                  "n_heads": 2},
        "data": {"seq_len": 16}, "task": {"name": "mlm"}, "fusion": {"method": "dwatt"}})
    task = task_for(cfg)
    fresh = task.build_model(key=jax.random.key(0))
    other = jax.tree.map(lambda a: jnp.zeros((a.shape[0] + 1, *a.shape[1:]), a.dtype)
                         if eqx.is_array(a) else a, fresh.head)  # a head of other shapes
    monkeypatch.setattr(backbones, "load_backbone", lambda c, m: (fresh.backbone, other, 3))
    task.cfg = Config.from_dict({**cfg.to_dict(), "task": {"name": "mlm", "init_from": "src"}})
    model = task.initial_model(None, fresh)
    assert all(x is y for x, y in zip(jax.tree.leaves(model.head), jax.tree.leaves(fresh.head)))
    assert "the MLM head of src does not fit" in capsys.readouterr().err


def test_classification_losses_are_float32():
    from jaxdepth.tasks.losses import softmax_xent

    logits = jax.random.normal(jax.random.key(0), (4, 5, 11)) * 30
    labels = jax.random.randint(jax.random.key(1), (4, 5), 0, 11)
    f32 = softmax_xent(logits, labels)
    gold = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
    reference = jax.nn.logsumexp(logits, -1) - gold
    np.testing.assert_array_equal(np.asarray(f32), np.asarray(reference))  # unchanged
    bf16 = softmax_xent(logits.astype(jnp.bfloat16), labels)
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(bf16), np.asarray(
        softmax_xent(logits.astype(jnp.bfloat16).astype(jnp.float32), labels)), rtol=0, atol=0)


def test_the_validation_split_of_a_text_corpus_has_its_own_seed(tmp_path):
    from jaxdepth.data.corpus.prepare import load_documents

    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"document {i} ." for i in range(200)))

    def valid(**fields):
        return load_documents(DataConfig(corpus=str(path), valid_fraction=0.1, **fields))[1]

    assert valid(grammar_seed=1) == valid(grammar_seed=2)  # the grammar's seed is not used
    assert valid(valid_seed=1) != valid(valid_seed=2)
    assert valid() == valid(valid_seed=1234)
    # A checkpoint from before data.valid_seed: its split was seeded with data.grammar_seed,
    # so resuming it asks for that seed rather than silently taking another split.
    from jaxdepth.trainer.restore import check_compatible

    older = Config(data=DataConfig(grammar_seed=7)).to_dict()
    del older["data"]["valid_seed"]
    with pytest.raises(ConfigError, match="data.valid_seed: checkpoint 7 vs now 1234"):
        check_compatible(older, Config(data=DataConfig(grammar_seed=7)), tmp_path)
    check_compatible(older, Config(data=DataConfig(grammar_seed=7, valid_seed=7)), tmp_path)
