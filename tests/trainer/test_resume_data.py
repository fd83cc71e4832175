"""A resumed run trains on exactly the data it would have (issue 23), or stops with one line
naming the file and what changed: streamed corpora edited, extended or shrunk since the
checkpoint (data/corpus/streaming.py), the token-file cache of a changed corpus (data/corpus/prepare.py),
data.restart_stream, impossible window counts, a validation file inside the training
directory, loader workers that fail, NER tags outside the label set, a full disk while the
tokenizer is written.

Corpora are a few dozen grammar documents; expectations are written out by hand (messages,
line numbers) or computed independently of the code under test (a fresh iterator's batches,
the tokens of the training file alone)."""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from _train_helpers import REPO, TRAIN_PY, load_main, subprocess_env
from jaxdepth.config import ConfigError, DataConfig
from jaxdepth.data.embedded import grammar
from jaxdepth.data.finetune.ner_sentences import LABELS, encode_sentences, read_split
from jaxdepth.data.corpus.pipeline import tokenize_documents
from jaxdepth.data.corpus.prepare import prepare_lm_data, prepare_streaming
from jaxdepth.data.corpus.streaming import streaming_dataset
from jaxdepth.data.corpus.tokenizer import Tokenizer, train_tokenizer
from jaxdepth.errors import DataError

SEQ, STREAMS = 16, 2
ADVICE = ("the checkpoint's stream positions belong to the corpus as it was: restore the corpus "
          "to resume exactly, or give --data.restart_stream true to resume on it as it is now, "
          "its data stream started afresh")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tok.model"
    train_tokenizer(grammar.corpus_texts(200, seed=1), 256).save(path)
    return str(path)


def jsonl(path: Path, texts: list[str]) -> str:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def shards(root: Path, n: int) -> list[str]:
    return [jsonl(root / f"f{i}.jsonl", grammar.corpus_texts(40, seed=10 + i)) for i in range(n)]


def take(files, tok, n, *, state=None, restart=False):
    """(n batches, the state after them) of a fresh iterator, optionally restored."""
    more = {"restart": True} if restart else {}
    it = iter(streaming_dataset(files, seq_len=SEQ, global_batch=2 * STREAMS, n_streams=STREAMS,
                                seed=3, tokenizer=tok, **more))
    if state is not None:
        it.set_state(json.loads(json.dumps(state)))  # as a checkpoint stores it
    out = [next(it) for _ in range(n)]
    state = it.get_state()
    it.close()
    return out, state


def same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert np.array_equal(x[k], y[k]), k


def keep_mtime(path, edit) -> None:
    """Edit a file and give it back its modification time (rsync -t, cp -p, touch -r do)."""
    st = os.stat(path)
    edit()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# ----------------------------------------------------------------------------- 2, 3. streams

def test_state_records_the_corpus_and_an_old_state_still_resumes(tmp_path, tok):
    files = shards(tmp_path, 2)
    ref, _ = take(files, tok, 8)
    _, state = take(files, tok, 3)
    assert state["batches"] == 3
    assert state["corpus"] == [[f, os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]
    cursors = state["loader"]["cursors"]
    assert sorted(cursors) == ["0", "1"] and all(len(c) == 5 for c in cursors.values())
    # a checkpoint written before these records: the loader's state alone, 4-field cursors
    old = {"cursors": {s: c[:4] for s, c in cursors.items()}}
    rest, after = take(files, tok, 5, state=old)
    same(ref[3:], rest)
    assert after["batches"] is None  # not counted then: a restart cannot name the step


@pytest.mark.parametrize("where", ["at", "before"])
def test_text_edited_up_to_the_cursor_is_refused(tmp_path, tok, where):
    """Same size, same modification time: only the hash of the text read catches it."""
    files = shards(tmp_path, 2)
    _, state = take(files, tok, 6)
    epoch, file_pos, line, offset = state.get("loader", state)["cursors"]["0"][:4]
    assert (epoch, file_pos) == (0, 0) and line > 1 and offset > 0  # inside f0's document
    target = line if where == "at" else line - 1

    def edit():  # the words in reverse order: same bytes, same tokens (the old check passed)
        lines = Path(files[0]).read_text().splitlines(keepends=True)
        words = json.loads(lines[target - 1])["text"].split(" ")
        lines[target - 1] = json.dumps({"text": " ".join(words[::-1])}) + "\n"
        Path(files[0]).write_text("".join(lines))

    keep_mtime(files[0], edit)
    with pytest.raises(DataError) as e:
        take(files, tok, 1, state=state)
    assert str(e.value) == (f"{files[0]}:{line}: the file's text up to the end of this document "
                            f"changed since the checkpoint was written; {ADVICE}")


def test_a_modified_shard_is_refused(tmp_path, tok):
    files = shards(tmp_path, 2)
    _, state = take(files, tok, 4)
    size, line = os.stat(files[1]).st_size, _line("a new document .")
    with open(files[1], "a") as f:  # after every cursor: the old code resumed on it
        f.write(line)
    with pytest.raises(DataError) as e:
        take(files, tok, 1, state=state)
    assert str(e.value) == (f"{files[1]}: changed since the checkpoint was written (size {size} "
                            f"-> {size + len(line)} bytes); {ADVICE}")


def test_an_added_or_removed_shard_is_refused(tmp_path, tok):
    files = shards(tmp_path, 3)
    _, state = take(files[:2], tok, 4)
    with pytest.raises(DataError, match=rf"^{files[2]}: added to data.corpus since the "
                                            r"checkpoint was written \(the files would be dealt"):
        take(files, tok, 1, state=state)
    _, state = take(files, tok, 4)
    with pytest.raises(DataError, match=rf"^{files[2]}: in data.corpus when the checkpoint "
                                            r"was written, gone now; the checkpoint's"):
        take(files[:2], tok, 1, state=state)


@pytest.mark.parametrize("changed", [True, False])
def test_restart_stream_starts_afresh_at_the_restored_step(tmp_path, tok, capsys, changed):
    files = shards(tmp_path, 3)
    _, state = take(files[:2], tok, 5)
    now = files if changed else files[:2]
    fresh, _ = take(now, tok, 4)  # a fresh run on the corpus as it is now
    capsys.readouterr()
    got, after = take(now, tok, 4, state=state, restart=True)
    same(fresh, got)
    assert after["batches"] == 9
    what = (f"the corpus changed: {files[2]}: added to data.corpus since the checkpoint was "
            f"written (the files would be dealt to the streams anew)" if changed
            else "the corpus is unchanged")
    assert capsys.readouterr().err == (
        f"warning: data.restart_stream: the data stream starts afresh at step 5, on the "
        f"{len(now)} files of data.corpus as a fresh run reads them ({what}); drop "
        f"--data.restart_stream when resuming again, or each resume restarts it\n")


@pytest.mark.slow
def test_train_py_refuses_an_added_shard_and_restarts_the_stream_when_asked(tmp_path, tok,
                                                                          capsys):
    """Through train.py and a real checkpoint: a shard added before resuming is one error
    line (exit 2, the checkpoint kept), and --data.restart_stream true resumes at its step."""
    files = shards(tmp_path, 3)
    valid = jsonl(tmp_path / "valid.jsonl", grammar.corpus_texts(10, seed=8))
    extra = tmp_path / "extra"
    extra.mkdir()
    os.replace(files[2], extra / "f2.jsonl")

    def argv(steps, **fields):
        args = {"run.dir": tmp_path / "run", "run.steps": steps, "run.save_every": 2,
                "run.progress": "false", "run.samples": 0, "run.grammar_samples": 0,
                "run.eval_every": 1000,
                "data.streaming": "true", "data.streams": 2, "data.corpus": f"{tmp_path}/f*.jsonl",
                "data.valid": valid, "data.tokenizer": tok, "model.vocab_size": 256,
                "data.seq_len": 16, "data.batch_size": 4, "mesh.data": 1, **fields}
        return ["--preset", "tiny-L2"] + [str(a) for k, v in args.items() for a in (f"--{k}", v)]

    main = load_main("train.py")
    assert main(argv(2)) == 0
    os.replace(extra / "f2.jsonl", files[2])
    capsys.readouterr()
    before = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    assert main(argv(4)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"error: {files[2]}: added to data.corpus since the checkpoint was written (the files "
        f"would be dealt to the streams anew); {ADVICE}")
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == before == ["2"]
    assert main(argv(4, **{"data.restart_stream": "true"})) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "restart_stream" in line]
    assert warnings == [
        f"warning: data.restart_stream: the data stream starts afresh at step 2, on the 3 files "
        f"of data.corpus as a fresh run reads them (the corpus changed: {files[2]}: added to "
        f"data.corpus since the checkpoint was written (the files would be dealt to the streams "
        f"anew)); drop --data.restart_stream when resuming again, or each resume restarts it"]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "4"]


# ----------------------------------------------------------------------------- 4. token cache

def test_the_token_cache_of_a_changed_corpus_is_not_reused(tmp_path, tok, capsys):
    corpus = Path(jsonl(tmp_path / "c.jsonl", grammar.corpus_texts(60, seed=5)))
    cfg = DataConfig(corpus=str(corpus), tokenizer=tok, valid_fraction=0.1)
    run = tmp_path / "run"
    first = np.array(prepare_lm_data(cfg, 256, run, True).train)
    (run / "checkpoints" / "5").mkdir(parents=True)  # the run trained on the cached tokens
    size = corpus.stat().st_size
    keep_mtime(corpus, lambda: corpus.write_text(corpus.read_text().replace("cat", "dog")))
    with pytest.raises(DataError) as e:
        prepare_lm_data(cfg, 256, run, True)
    assert str(e.value) == (
        f"{corpus}: changed since the cache was built (same size, other bytes); the checkpoints "
        f"in {run / 'checkpoints'} trained on the tokens cached in {run / 'data'} from it: "
        f"restore the file to resume exactly, give --data.restart_stream true to re-tokenize "
        f"the corpus as it is now and resume on it, or start afresh with another --run.dir")
    assert np.array_equal(np.load(run / "data" / "train.npy"), first)  # nothing touched
    added = _line("the dog ran .")
    with open(corpus, "a") as f:
        f.write(added)
    capsys.readouterr()
    again = prepare_lm_data(dataclasses.replace(cfg, restart_stream=True), 256, run, True)
    assert capsys.readouterr().err == (
        f"warning: data.restart_stream: {corpus}: changed since the cache was built (size "
        f"{size} -> {size + len(added)} bytes); {run / 'data'} is re-tokenized with the run's "
        f"tokenizer {run / 'data' / 'tokenizer.model'} from the corpus as it is now, and the "
        f"run resumes on it at its checkpoint's step\n")
    assert len(again.train) > len(first)
    # the run's tokenizer deleted: none other can stand in for it
    tok_path = run / "data" / "tokenizer.model"
    kept_tok = tok_path.read_bytes()
    tok_path.unlink()
    size = corpus.stat().st_size
    with open(corpus, "a") as f:
        f.write(added)
    with pytest.raises(DataError) as e:
        prepare_lm_data(dataclasses.replace(cfg, restart_stream=True), 256, run, True)
    assert str(e.value) == (
        f"{corpus}: changed since the cache was built (size {size} -> {size + len(added)} "
        f"bytes); data.restart_stream re-tokenizes it with the tokenizer the checkpoints in "
        f"{run / 'checkpoints'} trained with, {tok_path}, which is gone: restore it, or start "
        f"afresh with another --run.dir")
    tok_path.write_bytes(kept_tok)
    corpus.write_text(corpus.read_text()[:-len(added)])
    # a stamp written before files were stamped is taken as it is
    stamp = json.loads((run / "data" / "source.json").read_text())
    del stamp["files"]
    (run / "data" / "source.json").write_text(json.dumps(stamp))
    corpus.write_text(corpus.read_text() + json.dumps({"text": "a cat ran ."}) + "\n")
    kept = prepare_lm_data(cfg, 256, run, True)
    assert np.array_equal(np.array(kept.train), np.array(again.train))


def test_restart_stream_re_tokenizes_a_changed_corpus_with_the_runs_tokenizer(tmp_path, capsys):
    """A run that trained its own tokenizer, resumed on a changed corpus with
    --data.restart_stream true, keeps that tokenizer (its model's ids mean the same pieces)
    and re-tokenizes the corpus as it is now with it: the tokens are the new documents
    encoded by the tokenizer of the first start, its file unchanged byte for byte."""
    texts = grammar.corpus_texts(80, seed=5)
    corpus = Path(jsonl(tmp_path / "c.jsonl", texts))
    valid = jsonl(tmp_path / "valid.jsonl", grammar.corpus_texts(10, seed=8))
    run = tmp_path / "run"

    def argv(steps, **fields):
        args = {"run.dir": run, "run.steps": steps, "run.save_every": 2, "run.progress": "false",
                "run.samples": 0, "run.grammar_samples": 0, "run.eval_every": 1000,
                "data.corpus": corpus, "data.valid": valid, "model.vocab_size": 128,
                "data.seq_len": 16, "data.batch_size": 4, "mesh.data": 1, **fields}
        return ["--preset", "tiny-L2"] + [str(a) for k, v in args.items() for a in (f"--{k}", v)]

    main = load_main("train.py")
    assert main(argv(2)) == 0
    tok_path = run / "data" / "tokenizer.model"
    trained = tok_path.read_bytes()
    # another corpus: a tokenizer trained on it would map the ids to other pieces
    changed = grammar.corpus_texts(80, seed=6) + [t.replace("cat", "dog") for t in texts]
    size = corpus.stat().st_size
    jsonl(corpus, changed)
    capsys.readouterr()
    assert main(argv(4, **{"data.restart_stream": "true"})) == 0
    assert tok_path.read_bytes() == trained
    want = tokenize_documents(changed, Tokenizer.load(str(tok_path)))
    assert np.array_equal(np.load(run / "data" / "train.npy"), want)
    assert json.loads((run / "summary.json").read_text())["step"] == 4
    warnings = [line for line in capsys.readouterr().err.splitlines() if "restart_stream" in line]
    assert warnings == [
        f"warning: data.restart_stream: {corpus}: changed since the cache was built (size "
        f"{size} -> {corpus.stat().st_size} bytes); {run / 'data'} is re-tokenized with the "
        f"run's tokenizer {tok_path} from the corpus as it is now, and the run resumes on it at "
        f"its checkpoint's step"]


# ----------------------------------------------------------------------------- 7. window counts

@pytest.mark.parametrize("fields, message", [
    ({"data.seq_len": 4096},
     "config error: data.seq_len: 4096 is longer than the training text: data.corpus {c} makes "
     "{n} training tokens, and a window takes data.seq_len + 1; lower --data.seq_len"),
    ({"data.batch_size": 100000},
     "config error: data.batch_size: 100000 windows per batch are more than the {w} windows of "
     "data.seq_len=32 that data.corpus {c} makes ({n} training tokens); lower --data.batch_size "
     "(or --data.seq_len)"),
    ({"data.valid_fraction": 0},
     "config error: data.valid_fraction: 0.0 holds out no validation document of data.corpus "
     "{c}; give --data.valid files or a larger --data.valid_fraction"),
])
def test_too_few_windows_is_a_config_error(tmp_path, tok, capsys, fields, message):
    corpus = tmp_path / "tiny.txt"
    docs = grammar.corpus_texts(40, seed=2)
    corpus.write_text("\n\n".join(docs))
    args = {"run.dir": tmp_path / "run", "run.steps": 2, "run.progress": "false",
            "run.samples": 0, "run.grammar_samples": 0, "data.corpus": corpus,
            "data.tokenizer": tok,
            "model.vocab_size": 256, "data.seq_len": 32, "data.batch_size": 8, "mesh.data": 1,
            "data.valid_fraction": 0.05, **fields}
    argv = ["--preset", "tiny-L2"] + [str(a) for k, v in args.items() for a in (f"--{k}", v)]
    code = load_main("train.py")(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    # independent count: the training documents' tokens (held-out ones drawn with valid_seed)
    n = None
    if "{n}" in message:
        from jaxdepth.data.corpus.pipeline import split_documents
        kept, _ = split_documents(docs, 0.05, seed=1234)
        n = len(tokenize_documents(kept, Tokenizer.load(tok)))
    line = message.format(c=corpus, n=n, w=None if n is None else (n - 1) // 32)
    assert err.strip().splitlines()[-1] == line


# ----------------------------------------------------------------------------- 8. loader workers

def _cut_gzip(path: Path, good: list[str], rest: list[str]) -> None:
    """A .gz whose first len(good) lines can be read and nothing after them."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as f:
        f.write("".join(good).encode())
        f.flush(zlib.Z_FULL_FLUSH)
        cut = buf.tell()
        f.write("".join(rest).encode())
    path.write_bytes(buf.getvalue()[:cut + 1])


def _line(t: str) -> str:
    return json.dumps({"text": t}) + "\n"


def _bad_shard(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A shard whose 4th line fails in the way `case` names, and the error line expected."""
    good = [_line(t) for t in grammar.corpus_texts(30, seed=4)]
    if case == "missing_text":
        bad = tmp_path / "b.jsonl"
        bad.write_text("".join(good[:3]) + json.dumps({"txt": "x"}) + "\n" + "".join(good[3:]))
        return bad, f"error: {bad}:4: missing field 'text'"
    if case == "not_utf8":
        bad = tmp_path / "b.jsonl"
        bad.write_bytes("".join(good[:3]).encode() + b'{"text": "a \xff"}\n'
                        + "".join(good[3:]).encode())
        return bad, f"error: {bad}:4: not UTF-8 text (byte 0xff at column 13)"
    bad = tmp_path / "b.jsonl.gz"
    _cut_gzip(bad, good[:3], good[3:])
    return bad, (f"error: {bad}: truncated or corrupt gzip file: no line after line 3 can be "
                 f"read (Compressed file ended before the end-of-stream marker was reached)")


def _only_the_error(res: subprocess.CompletedProcess, expected: str) -> None:
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == expected, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "leaked" not in res.stderr, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["not_utf8", "truncated_gz"])  # missing_text: train.py below
def test_a_worker_error_is_the_last_line_printed(tmp_path, tok, case):
    """Two loader workers behind the error boundary, without a model (the run below adds
    one): the error line is the last thing the process prints."""
    good = jsonl(tmp_path / "a.jsonl", grammar.corpus_texts(200, seed=6))
    bad, expected = _bad_shard(tmp_path, case)
    script = f"""
import sys
from jaxdepth.data.corpus.streaming import streaming_dataset
from jaxdepth.errors import run_main

def body():
    it = iter(streaming_dataset([{good!r}, {str(bad)!r}], seq_len=32, global_batch=8,
                                n_streams=2, seed=0, tokenizer={tok!r}, workers=2))
    for _ in range(50):
        next(it)
    return 0

sys.exit(run_main(body, debug=False))
"""
    _only_the_error(subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                                   text=True, env=subprocess_env(), timeout=240), expected)


@pytest.mark.slow
def test_a_worker_error_ends_train_py_with_one_line(tmp_path, tok):
    jsonl(tmp_path / "a.jsonl", grammar.corpus_texts(200, seed=6))
    bad, expected = _bad_shard(tmp_path, "missing_text")
    valid = jsonl(tmp_path / "valid.jsonl", grammar.corpus_texts(10, seed=8))
    args = {"run.dir": tmp_path / "run", "run.steps": 50, "run.progress": "false",
            "run.samples": 0, "run.grammar_samples": 0, "run.eval_every": 1000,
            "data.streaming": "true",
            "data.workers": 2, "data.streams": 2, "data.corpus": f"{tmp_path}/a.jsonl,{bad}",
            "data.valid": valid, "data.tokenizer": tok, "model.vocab_size": 256,
            "data.seq_len": 32, "data.batch_size": 8, "mesh.data": 1}
    argv = ["--preset", "tiny-L2"] + [str(a) for k, v in args.items() for a in (f"--{k}", v)]
    _only_the_error(subprocess.run([sys.executable, str(TRAIN_PY), *argv], cwd=REPO,
                                   capture_output=True, text=True, env=subprocess_env(),
                                   timeout=240), expected)


# ----------------------------------------------------------------------------- 9. NER tags

def test_an_unknown_ner_tag_names_file_line_and_tag(tmp_path):
    d = tmp_path / "ner"
    d.mkdir()
    rows = ["en:John\tB-PER", "en:lives\tO", "", "en:Visit\tO", "en:EU\tB-MISC", ""]
    (d / "train").write_text("\n".join(rows) + "\n")
    sents = read_split(d, "train")
    with pytest.raises(DataError) as e:
        encode_sentences(sents, lambda words: [[5] for _ in words], LABELS, seq_len=16,
                         max_words=4, cls_id=1, sep_id=2, pad_id=0)
    assert str(e.value) == (f"{d / 'train'}:5: tag 'B-MISC' is not in the label set "
                            f"{list(LABELS)}")


# ----------------------------------------------------------------------------- 10. data.valid

def test_the_validation_file_is_never_trained_on(tmp_path, tok, capsys):
    d = tmp_path / "corpus"
    d.mkdir()
    train_docs, valid_docs = grammar.corpus_texts(40, seed=2), grammar.corpus_texts(20, seed=3)
    jsonl(d / "a.jsonl", train_docs)
    valid = jsonl(d / "valid.jsonl", valid_docs)
    cfg = DataConfig(corpus=str(d), valid=valid, tokenizer=tok, seq_len=SEQ, batch_size=4)
    capsys.readouterr()
    data = prepare_lm_data(cfg, 256, tmp_path / "run", True)
    warning = f"warning: data.corpus: {valid} is data.valid too; not trained on\n"
    assert capsys.readouterr().err == warning
    t = Tokenizer.load(tok)
    assert np.array_equal(np.array(data.train), tokenize_documents(train_docs, t))
    assert np.array_equal(np.array(data.valid), tokenize_documents(valid_docs, t))
    streamed = prepare_streaming(DataConfig(streaming=True, streams=1, **{
        k: getattr(cfg, k) for k in ("corpus", "valid", "tokenizer", "seq_len", "batch_size")}),
        256, tmp_path / "srun", True)
    assert streamed.files == [str(d / "a.jsonl")]
    assert capsys.readouterr().err == warning
    with pytest.raises(ConfigError, match=rf"data.corpus: every file of it is also data.valid "
                                          rf"\({valid}\); name the training files"):
        prepare_lm_data(DataConfig(corpus=valid, valid=valid, tokenizer=tok), 256,
                        tmp_path / "run2", True)


# ----------------------------------------------------------------------------- 12. full disk

def test_a_full_disk_while_writing_the_tokenizer_leaves_no_partial_file(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(grammar.corpus_texts(200, seed=9)))
    source = tmp_path / "given.model"
    train_tokenizer(grammar.corpus_texts(200, seed=9), 128).save(source)
    assert source.stat().st_size > 2000
    script = f"""
import resource, sys
from pathlib import Path
from jaxdepth.config import DataConfig
from jaxdepth.data.corpus.prepare import prepare_lm_data, run_tokenizer
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
for name, call in [
    ("trained", lambda run: prepare_lm_data(DataConfig(corpus={str(corpus)!r}), 128, run, True)),
    ("copied", lambda run: run_tokenizer(run, 128, True,
                                         copy_from=({str(source)!r}, "data.tokenizer"))),
]:
    run = Path({str(tmp_path)!r}) / name
    try:
        call(run)
    except OSError as e:
        print(name, e.strerror, e.filename)
    print(name, sorted(p.name for p in (run / "data").iterdir()))
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, env=subprocess_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == [
        f"trained File too large {tmp_path / 'trained' / 'data' / 'tokenizer.model'}",
        "trained []",
        f"copied File too large {tmp_path / 'copied' / 'data' / 'tokenizer.model'}",
        "copied []",
    ]
