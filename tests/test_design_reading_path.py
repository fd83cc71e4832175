"""docs/design.md's footprint and reading path are the tree's: the footprint names every room
of jaxdepth/ with its files and lines, and their total; the reading path names whole files with
their line counts, and their total (an edit of one of them updates the page)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section(title: str = "### Reading path", end: str = "\n## ") -> str:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index(title)
    return text[start:text.index(end, start)]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_footprint_table_is_the_tree_s():
    section = _section("### Footprint", "\n### ")
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| ([\d,]+) \|", section, re.M)
    package = REPO / "jaxdepth"
    rooms = {f"jaxdepth/{e.name}" + ("/" if e.is_dir() else "") for e in package.iterdir()
             if e.name != "__init__.py" and (e.suffix == ".py" or (e / "__init__.py").is_file())}
    assert {path for path, _, _ in rows} == rooms
    files = lines = 0
    for path, n, k in rows:
        found = sorted((REPO / path).rglob("*.py")) if path.endswith("/") else [REPO / path]
        assert (len(found), sum(map(_lines, found))) == (int(n), int(k.replace(",", ""))), path
        files, lines = files + len(found), lines + sum(map(_lines, found))
    total = re.search(r"^In all: ([\d,]+) lines in (\d+) files", section, re.M)
    init = _lines(package / "__init__.py")
    assert total and (int(total.group(1).replace(",", "")), int(total.group(2))) == \
        (lines + init, files + 1), total


def test_the_reading_path_s_files_and_counts_are_the_tree_s():
    section = _section()
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", section, re.M)
    models = [p for p, _ in rows if p.startswith("jaxdepth/models/")]
    # the step's files (none of them a model), then the decoder, ACT and DWAtt
    assert len(rows) > 3 and rows[-3:] == [(p, n) for p, n in rows if p in models], rows
    for path, lines in rows:
        assert (REPO / path).is_file(), path
        have = len((REPO / path).read_text(encoding="utf-8").splitlines())
        assert have == int(lines), f"{path}: {have} lines, docs/design.md says {lines}"
    step = rows[:-3]  # the models' table comes last
    total = re.search(r"^(\d+) files, ([\d,]+) lines", section, re.M)
    assert total and (int(total.group(1)), int(total.group(2).replace(",", ""))) == \
        (len(step), sum(int(n) for _, n in step)), total


def test_the_package_s_lines_fit_in_100_columns():
    """The footprint counts lines of at most 100 columns (issue 49's measure): a longer line
    would hide lines from it."""
    files = sorted((REPO / "jaxdepth").rglob("*.py")) + [REPO / "train.py", REPO / "eval.py"]
    long = [f"{p.relative_to(REPO)}:{i} ({len(line)} columns)" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > 100]
    assert not long, "lines over 100 columns:\n" + "\n".join(long)
