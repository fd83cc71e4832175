"""docs/design.md's reading path names whole files of the tree with their line counts, and its
total: each file exists and has the lines the page says (an edit of one of them updates the
page), and the total is their sum."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("### Reading path")
    return text[start:text.index("\n## ", start)]


def test_the_reading_path_s_files_and_counts_are_the_tree_s():
    section = _section()
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", section, re.M)
    assert len(rows) >= 15, rows
    for path, lines in rows:
        assert (REPO / path).is_file(), path
        have = len((REPO / path).read_text(encoding="utf-8").splitlines())
        assert have == int(lines), f"{path}: {have} lines, docs/design.md says {lines}"
    step = rows[:-3]  # the models' table comes last
    total = re.search(r"^(\d+) files, ([\d,]+) lines", section, re.M)
    assert total and (int(total.group(1)), int(total.group(2).replace(",", ""))) == \
        (len(step), sum(int(n) for _, n in step)), total
