import gzip
import json

import pytest

from jaxdepth.data.corpus.readers import iter_documents, read_corpus

TEXT = "first line\nsecond line\n\n\n  \t\nthird doc\n\nfourth doc\nlast line"
TEXT_DOCS = ["first line\nsecond line", "third doc", "fourth doc\nlast line"]


def read_text(path):
    """Documents of a plain-text file: blocks of lines separated by blank lines."""
    return [d for _, d in iter_documents(path, "text")]


def read_jsonl(path, field="text"):
    """The string `field` of every JSON object in a JSONL file (C4: url, text, timestamp)."""
    return [d for _, d in iter_documents(path, "jsonl", field=field)]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_read_text_splits_on_blank_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n" + TEXT + "\n\n")
    assert read_text(path) == TEXT_DOCS


def test_read_text_handles_crlf(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(TEXT.replace("\n", "\r\n").encode())
    assert read_text(path) == TEXT_DOCS


def test_read_jsonl(tmp_path):
    path = tmp_path / "c4.jsonl"
    write_jsonl(path, [
        {"url": "u1", "text": "one\ntwo", "timestamp": "t"},
        {"url": "u2", "text": "three", "timestamp": "t"},
    ])
    with path.open("a") as f:
        f.write("\n   \n")  # blank lines are skipped
    assert read_jsonl(path) == ["one\ntwo", "three"]
    assert read_jsonl(path, field="url") == ["u1", "u2"]


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: malformed JSON"):
        read_jsonl(path)


def test_missing_field_names_file_and_line(tmp_path):
    path = tmp_path / "nofield.jsonl"
    write_jsonl(path, [{"text": "a"}, {"body": "b"}])
    with pytest.raises(ValueError, match=r"nofield\.jsonl:2: missing field 'text'"):
        read_jsonl(path)


def test_non_string_field_and_non_object(tmp_path):
    path = tmp_path / "types.jsonl"
    write_jsonl(path, [{"text": 7}])
    with pytest.raises(ValueError, match=r"types\.jsonl:1: field 'text' is int"):
        read_jsonl(path)
    write_jsonl(path, [["text"]])
    with pytest.raises(ValueError, match=r"types\.jsonl:1: expected a JSON object"):
        read_jsonl(path)


def test_read_corpus_dispatches_and_concatenates_in_order(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text(TEXT)
    jsonl = tmp_path / "b.jsonl"
    write_jsonl(jsonl, [{"text": "j1"}, {"text": "   "}, {"text": "j2"}])
    text_gz = tmp_path / "c.txt.gz"
    with gzip.open(text_gz, "wt") as f:
        f.write("gz doc one\n\ngz doc two\n")
    jsonl_gz = tmp_path / "d.jsonl.gz"
    with gzip.open(jsonl_gz, "wt") as f:
        f.write(json.dumps({"text": "gz json"}) + "\n")
    # The whitespace-only JSONL document is dropped.
    assert read_corpus([jsonl_gz, text, jsonl, str(text_gz)]) == (
        ["gz json"] + TEXT_DOCS + ["j1", "j2"] + ["gz doc one", "gz doc two"]
    )


def test_read_corpus_explicit_format(tmp_path):
    path = tmp_path / "data.dat"
    write_jsonl(path, [{"text": "x"}])
    assert read_corpus([path]) == ['{"text": "x"}']
    assert read_corpus([path], fmt="jsonl") == ["x"]
    with pytest.raises(ValueError, match="unknown corpus format 'csv'"):
        read_corpus([path], fmt="csv")


def test_missing_file(tmp_path):
    (tmp_path / "here.txt").write_text("doc")
    with pytest.raises(FileNotFoundError, match=r"absent\.txt"):
        read_corpus([tmp_path / "here.txt", tmp_path / "absent.txt"])
    with pytest.raises(FileNotFoundError, match=r"absent\.jsonl"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_empty_corpus(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    empty = tmp_path / "empty.jsonl"
    write_jsonl(empty, [{"text": ""}, {"text": " \n "}])
    with pytest.raises(ValueError, match=r"empty corpus.*blank\.txt.*empty\.jsonl"):
        read_corpus([blank, empty])
    with pytest.raises(ValueError, match="empty corpus"):
        read_corpus([])


def test_c4_sample(shared_data):
    path = shared_data / "c4_sample" / "c4-en-train.00000-of-01024.first2docs.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    docs = read_corpus([path])
    # Despite its name (and `wc -l` = 2), the file holds three records: the last line has no
    # trailing newline.
    assert len(docs) == 3
    assert docs[0].startswith("Beginners BBQ Class Taking Place in Missoula!\n")
    assert docs[1].startswith('Discussion in "Mac OS X Lion (10.7)" started by')
    assert docs[2].startswith("Foil plaid lycra and spandex shortall")
