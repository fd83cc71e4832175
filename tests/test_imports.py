"""The package's import graph and its references, read from the source with ``ast`` (nothing
is imported or run):

(a) no import cycle between jaxdepth modules, nor between its packages;
(b) ``jaxdepth/models/`` imports nothing of the package above it: only ``jaxdepth.models.*``
    (which owns its configs: the model section, ACT's, the attention paths, architectures,
    halting, fusion modes, the per-trial settings and the stacked-models type) and the leaf
    modules under every config (``jaxdepth.errors``, ``jaxdepth.choices``: the registry base,
    ``jaxdepth.fields``: how a field is declared), and third-party modules; the configuration
    (``jaxdepth.config``) composes the models' sections, never the other way;
(c) ``jaxdepth/trainer/`` imports neither ``jaxdepth.tasks`` nor ``jaxdepth.models``, but the
    stacked-models type and the per-trial settings (``jaxdepth.models.trial_axis``,
    ``jaxdepth.models.trial_tracing``): the trainer knows no task and no model class (skipped
    while ``jaxdepth/trainer`` is absent);
(d) no source file names the old design file or a path outside the repository;
and every import of a jaxdepth module, and every name taken from one, exists (a stale import
inside a function body fails only when that function runs, so the rest of the suite can miss it).

What counts as an import of module M by module A (an edge A -> M):

- every ``import`` / ``from ... import`` statement anywhere in A's file: module level, and
  inside functions, methods, classes, ``if`` and ``try`` blocks; and
  ``importlib.import_module("jaxdepth....")`` with a constant absolute name;
- relative imports are resolved against A's package (``from ..config import X`` in
  jaxdepth/models/act.py is jaxdepth.config); ``from P import n`` is P.n when P.n is a module of
  the tree (a submodule import), else P (a name taken from P).

What does not:

- ``from __future__ import ...`` (a compiler directive, not a module);
- standard-library and third-party modules: only ``jaxdepth.*`` is checked;
- the parent packages Python initialises on the way (``import jaxdepth.models.act`` runs
  jaxdepth/models/__init__.py first): counting them would make every package whose
  ``__init__`` re-exports a submodule look cyclic;

Imports under ``if TYPE_CHECKING:``, which never run, count all the same, for the cycle checks
as for the layering rules (b) and (c): a type-only import is still the dependency, and a
type-only circle still a circle between the modules.

Imports inside ``try`` blocks that catch ImportError (or Exception, or everything: optional
imports, fallbacks) are edges like any other when they resolve; only the resolution check lets
them name a missing module.

Rule (d), precisely. The files: every ``.py`` and ``.md`` under jaxdepth/, benchmarks/ and
tests/, and train.py and eval.py (this file excepted: it has to spell out what it forbids). A
file fails if it

- names the old design file: ``DESIGN.md``, or ``DESIGN`` followed by ``§`` or ``section``
  (the design now lives in docs/design.md);
- names the shared folder beside the checkout by a path: ``../shared`` or ``shared/data``
  (prose such as "the shared data directory" and the ``shared_data`` fixture are fine), or
  an absolute path to a sibling of the checkout (the checkout's parent directory followed
  by ``/shared``);
- builds a path above the repository root from ``__file__``
  (``Path(__file__).resolve().parents[k]``, ``.parent``, ``/ ".."``, ``os.path.dirname``).

tests/conftest.py is exempt from the path part of (d) only: its ``shared_data`` fixture is the
one place that locates the shared data directory (and skips when it is absent); every test
that reads real data takes that fixture.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "jaxdepth"
# The files rule (d) reads, relative to the repository root.
REFERENCE_DIRS = ("jaxdepth", "benchmarks", "tests")
REFERENCE_FILES = ("train.py", "eval.py")
THIS_FILE = Path(__file__).resolve()
_TRY = (ast.Try, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Try,)
SHARED_DATA_LOCATOR = REPO / "tests" / "conftest.py"  # exempt from the path rule only

MODELS_MAY_IMPORT = ("jaxdepth.models", "jaxdepth.errors", "jaxdepth.choices", "jaxdepth.fields")
TRAINER_MAY_NOT_IMPORT = ("jaxdepth.tasks", "jaxdepth.models")
TRAINER_MAY_IMPORT = ("jaxdepth.models.trial_axis", "jaxdepth.models.trial_tracing")
# Packages whose subpackages are units of the package-cycle check on their own.
GROUPED = ("jaxdepth.data",)


# ----------------------------------------------------------------------------- the import graph

@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. "jaxdepth.models.act"
    target: str  # the imported module, resolved, e.g. "jaxdepth.config" (may not exist)
    names: tuple[str, ...]  # for `from target import a, b`: ("a", "b"); () for `import target`
    path: Path
    line: int
    scope: str  # "" at module level, else the enclosing function or class
    type_only: bool  # under `if TYPE_CHECKING:`
    guarded: bool  # inside a `try` whose handlers catch ImportError

    def where(self) -> str:
        rel = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{rel}:{self.line}" + (f" (in {self.scope})" if self.scope else "")


def module_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package under root."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """(dotted name of the file as seen from root, whether it is a package __init__)."""
    parts = list(path.resolve().relative_to(root.resolve()).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = {t.id if isinstance(t, ast.Name) else getattr(t, "attr", None) for t in types}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, path: Path, module: str, is_package: bool, known: set[str]):
        self.path, self.module, self.known = path, module, known
        self.package = module if is_package else module.rpartition(".")[0]
        self.scope: list[str] = []
        self.type_only = 0
        self.guarded = 0
        self.found: list[Import] = []

    def _add(self, node, target: str, names: tuple[str, ...] = ()) -> None:
        self.found.append(Import(self.module, target, names, self.path, node.lineno,
                                 ".".join(self.scope), self.type_only > 0, self.guarded > 0))

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            return self.generic_visit(node)
        self.visit(node.test)
        self.type_only += 1
        for stmt in node.body:
            self.visit(stmt)
        self.type_only -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Try(self, node) -> None:
        guarded = any(_catches_import_error(h) for h in node.handlers)
        self.guarded += guarded
        for stmt in node.body:
            self.visit(stmt)
        self.guarded -= guarded
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    visit_TryStar = visit_Try  # (Python >= 3.11)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module == "__future__":
            return
        if node.level:
            base = self.package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = ".".join(p for p in (base, node.module) if p)
        else:
            base = node.module
        names = tuple(a.name for a in node.names)
        submodules = [n for n in names if f"{base}.{n}" in self.known]
        for n in submodules:  # `from pkg import module`: an import of pkg.module
            self._add(node, f"{base}.{n}")
        rest = tuple(n for n in names if n not in submodules)
        if rest or not names:
            self._add(node, base, rest)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (name == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
            self._add(node, node.args[0].value)
        self.generic_visit(node)


def imports_in(path: Path, root: Path, known: set[str]) -> list[Import]:
    """Every import in the file at path; module names are seen from root (the directory that
    holds the package)."""
    module, is_package = _module_name(path, root)
    visitor = _ImportVisitor(path, module, is_package, known)
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return visitor.found


def package_imports(root: Path = REPO, package: str = PACKAGE) -> list[Import]:
    """Every import in every module of the package, of a module of the package."""
    files = module_files(root, package)
    known = set(files)
    out = []
    for path in files.values():
        out += [i for i in imports_in(path, root, known) if _within(i.target, package)]
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def import_graph(imports: list[Import], known: set[str]) -> dict[str, set[str]]:
    """module -> modules it imports (TYPE_CHECKING imports included; imports of a module that
    does not exist are the resolution check's business)."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    for i in imports:
        if i.target in known:
            graph[i.source].add(i.target)
    return graph


# ----------------------------------------------------------------------------- cycles

def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted; iterative (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        comp.append(n)
                        if n == node:
                            break
                    out.append(sorted(comp))
    return sorted(out)


def _shortest_cycle_through(graph: dict[str, set[str]], node: str, within: set[str]) -> list[str]:
    prev = {node: None}
    queue = deque([node])
    while queue:
        cur = queue.popleft()
        for nxt in sorted(graph.get(cur, ())):
            if nxt == node:
                path = [cur]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1] + [node]
            if nxt in within and nxt not in prev:
                prev[nxt] = cur
                queue.append(nxt)
    raise AssertionError(f"{node} is on no cycle")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles, as [a, b, ..., a]: for every strongly connected component with a cycle
    (two or more modules, or a module importing itself), a shortest cycle through each of its
    modules, each cycle once (rotations are the same cycle), starting at its smallest name."""
    cycles = []
    seen = set()
    for comp in strongly_connected(graph):
        if len(comp) == 1 and comp[0] not in graph.get(comp[0], ()):
            continue
        for node in comp:
            cyc = _shortest_cycle_through(graph, node, set(comp))
            ring = cyc[:-1]
            k = ring.index(min(ring))
            canon = tuple(ring[k:] + ring[:k])
            if canon not in seen:
                seen.add(canon)
                cycles.append(list(canon) + [canon[0]])
    return sorted(cycles)


def _describe_cycle(cycle: list[str], imports: list[Import]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        where = [i.where() + (" (under TYPE_CHECKING)" if i.type_only else "")
                 for i in imports if i.source == a and i.target == b]
        lines.append(f"    {a} -> {b}: {', '.join(where)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the package

@pytest.fixture(scope="module")
def package():
    files = module_files(REPO)
    assert "jaxdepth.config" in files, "the package was not found"
    return files, package_imports()


def test_cycle_finder_on_a_synthetic_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a", "f"},
             "f": {"f"}, "g": {"h"}, "h": {"g", "a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["f", "f"], ["g", "h", "g"]]
    assert strongly_connected(graph) == [["a", "b", "c"], ["d"], ["e"], ["f"], ["g", "h"]]
    # two cycles through one module: a shortest cycle through each module of the component
    assert find_cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"a"}}) == [
        ["a", "b", "a"], ["a", "c", "d", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"b", "c"}}) == []
    deep = {i: {i + 1} for i in range(5000)}  # a 5000-deep search: no recursion limit
    deep[5000] = {4999}
    assert find_cycles(deep) == [[4999, 5000, 4999]]


def test_import_resolution_on_a_synthetic_package(tmp_path):
    files = {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": ("from __future__ import annotations\nimport os\nimport numpy as np\n"
                     "from . import b\nfrom .sub.c import K\nA = 1\n"),
        "pkg/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from pkg.sub import c\nelse:\n    import pkg.a\n"
                     "def f():\n    from .sub import helper, c as cc\n    return helper\n"),
        "pkg/sub/__init__.py": "helper = 2\n",
        "pkg/sub/c.py": ("import importlib\nclass K:\n    def m(self):\n        from .. import a\n"
                         "        return importlib.import_module('pkg.b')\n"
                         "try:\n    from ..gone import x\nexcept ImportError:\n    x = None\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    mods = module_files(tmp_path, "pkg")
    assert set(mods) == {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    found = package_imports(tmp_path, "pkg")
    got = {(i.source, i.target, i.names, i.line, i.scope, i.type_only, i.guarded) for i in found}
    assert got == {
        ("pkg", "pkg.a", ("A",), 1, "", False, False),
        ("pkg.a", "pkg.b", (), 4, "", False, False),
        ("pkg.a", "pkg.sub.c", ("K",), 5, "", False, False),
        ("pkg.b", "pkg.sub.c", (), 3, "", True, False),
        ("pkg.b", "pkg.a", (), 5, "", False, False),
        ("pkg.b", "pkg.sub", ("helper",), 7, "f", False, False),
        ("pkg.b", "pkg.sub.c", (), 7, "f", False, False),
        ("pkg.sub.c", "pkg.a", (), 4, "K.m", False, False),
        ("pkg.sub.c", "pkg.b", (), 5, "K.m", False, False),
        ("pkg.sub.c", "pkg.gone", ("x",), 7, "", False, True),
    }
    graph = import_graph(found, set(mods))
    assert graph["pkg.b"] == {"pkg.a", "pkg.sub", "pkg.sub.c"}  # TYPE_CHECKING's counts too
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.sub.c", "pkg.a"]]
    assert _unresolved(found, mods) == []  # the guarded import of pkg.gone may fail
    (tmp_path / "pkg/d.py").write_text("from pkg.a import A, B\nfrom .sub import helper, nope\n"
                                       "def g():\n    import pkg.missing\n")
    mods = module_files(tmp_path, "pkg")
    assert [m.split(": ", 1)[1] for m in _unresolved(package_imports(tmp_path, "pkg"), mods)] == [
        "pkg.a has no B", "pkg.sub has no nope", "no module pkg.missing"]


def test_no_import_cycles(package):
    files, imports = package
    cycles = find_cycles(import_graph(imports, set(files)))
    assert not cycles, (f"{len(cycles)} import cycle(s) between jaxdepth modules (imports inside "
                        "functions included):\n" + "\n".join(_describe_cycle(c, imports)
                                                             for c in cycles))


def package_graph(imports: list[Import], modules: set[str]) -> dict[str, set[str]]:
    """The import graph between jaxdepth's packages (``jaxdepth.tasks``), the groups of its
    data package (``jaxdepth.data.corpus``: each a concern of its own, ``GROUPED``) and its
    top-level modules (``jaxdepth.config``): an edge wherever one of A's modules imports one of
    B's, imports under TYPE_CHECKING included."""
    def unit(m: str) -> str:
        parts = m.split(".")
        grouped = ".".join(parts[:2]) in GROUPED and len(parts) > 3
        return ".".join(parts[:3 if grouped else 2])
    units = {unit(m) for m in modules}
    out: dict[str, set[str]] = {}
    for i in imports:
        a, b = unit(i.source), unit(i.target)
        if a != b and b in units:
            out.setdefault(a, set()).add(b)
    return out


def test_no_import_cycles_between_packages(package):
    """A cycle between packages (analysis -> tasks -> analysis) is a design knot even when no
    two modules import each other: neither package can be read, tested or replaced alone."""
    files, imports = package
    cycles = find_cycles(package_graph(imports, set(files)))
    assert not cycles, "import cycles between jaxdepth packages:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def _layering(imports: list[Import], where: str, allowed=None, forbidden=None) -> list[str]:
    bad = []
    for i in imports:
        if not _within(i.source, where) or _within(i.target, where):
            continue
        if allowed is not None and any(_within(i.target, a) for a in allowed):
            continue
        if forbidden is not None and not any(_within(i.target, f) for f in forbidden):
            continue
        note = " (under TYPE_CHECKING)" if i.type_only else ""
        bad.append(f"{i.where()}: {i.source} imports {i.target}{note}")
    return bad


def test_models_import_nothing_above_them(package):
    _, imports = package
    bad = _layering(imports, "jaxdepth.models", allowed=MODELS_MAY_IMPORT)
    assert not bad, ("jaxdepth/models/ may import only jaxdepth.models.* and the leaf modules "
                     "errors, choices and fields (no config, trainer, task, data, analysis or "
                     "experiment code):\n" + "\n".join(bad))


def test_trainer_knows_no_task_and_no_model(package):
    if not (REPO / "jaxdepth" / "trainer").is_dir():
        pytest.skip("jaxdepth/trainer does not exist yet (the train/ -> trainer/ + tasks/ move "
                    "has not landed): rule (c) has nothing to check")
    _, imports = package
    bad = _layering(imports, "jaxdepth.trainer", allowed=TRAINER_MAY_IMPORT,
                    forbidden=TRAINER_MAY_NOT_IMPORT)
    assert not bad, ("jaxdepth/trainer/ may not import jaxdepth.tasks or jaxdepth.models (the "
                     "trainer knows no task and no model class):\n" + "\n".join(bad))


# ----------------------------------------------------------------------------- resolution

def _bound_names(path: Path) -> set[str] | None:
    """Names a module binds at module level (in if/try/with/for blocks too); None if it can
    bind any name (a star import or a module __getattr__)."""
    names: set[str] = set()

    def targets(t):
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                targets(e)
        elif isinstance(t, ast.Starred):
            targets(t.value)

    def walk(body) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if node.name == "__getattr__" and not isinstance(node, ast.ClassDef):
                    return False
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if any(a.name == "*" for a in node.names):
                    return False
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.If, ast.For, ast.While, ast.With, *_TRY)):
                if isinstance(node, (ast.For,)):
                    targets(node.target)
                if isinstance(node, ast.With):
                    for item in node.items:
                        if item.optional_vars is not None:
                            targets(item.optional_vars)
                handlers = getattr(node, "handlers", [])
                blocks = [node.body, node.orelse, getattr(node, "finalbody", [])]
                blocks += [h.body for h in handlers]
                if not all(walk(b) for b in blocks):
                    return False
        return True

    tree = ast.parse(path.read_text(encoding="utf-8"))
    return names if walk(tree.body) else None


def _unresolved(imports: list[Import], files: dict[str, Path]) -> list[str]:
    bad = set()
    bound: dict[str, set[str] | None] = {}
    for i in imports:
        if i.guarded:
            continue
        if i.target not in files:
            bad.add((str(i.path), i.line, f"{i.where()}: no module {i.target}"))
            continue
        if i.target not in bound:
            bound[i.target] = _bound_names(files[i.target])
        have = bound[i.target]
        for n in i.names:
            if have is not None and n != "*" and n not in have:
                bad.add((str(i.path), i.line, f"{i.where()}: {i.target} has no {n}"))
    return [msg for *_, msg in sorted(bad)]


def _script_files() -> list[Path]:
    out = [REPO / f for f in REFERENCE_FILES if (REPO / f).is_file()]
    for d in ("benchmarks", "tests"):
        out += sorted((REPO / d).rglob("*.py"))
    return out


def test_every_jaxdepth_import_resolves(package):
    """Every module a jaxdepth import names exists and has the names taken from it, in the
    package and in the scripts, benchmarks and tests (optional imports in try/except
    ImportError excepted)."""
    files, imports = package
    known = set(files)
    for path in _script_files():
        imports = imports + [i for i in imports_in(path, REPO, known) if _within(i.target, PACKAGE)]
    bad = _unresolved(imports, files)
    assert not bad, "imports of jaxdepth modules or names that do not exist:\n" + "\n".join(bad)


# ----------------------------------------------------------------------------- references (d)

STALE_DESIGN = re.compile(r"\bDESIGN(?:\.md\b|\s*§|\s+section\b)")
SHARED_BY_PATH = re.compile(r"\.\./+shared\b|(?<![\w./-])shared/data\b")


def _sibling_paths() -> re.Pattern | None:
    """Absolute paths to a sibling of the checkout (its parent is not the filesystem root)."""
    parent = REPO.parent
    if parent == Path(parent.anchor):
        return None
    return re.compile(re.escape(str(parent)) + r"/(?!" + re.escape(REPO.name) + r"\b)[\w.-]")


def _path_climb(node: ast.expr) -> tuple[int, int] | None:
    """(level, highest level on the way) of the path expression node, in directories above
    the file's own directory, if it is built from __file__ (Path(__file__)[.resolve()]
    [.parents[k] | .parent | / "a/../b"]*, or os.path.dirname nested on __file__); else None."""
    def up(inner, n):
        return None if inner is None else (inner[0] + n, max(inner[1], inner[0] + n))

    if isinstance(node, ast.Name) and node.id == "__file__":
        return (-1, -1)  # the file itself: its directory is one .parent away
    if isinstance(node, ast.Call):
        f = node.func
        fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if fname in ("Path", "PurePath", "abspath", "realpath", "normpath") and node.args:
            return _path_climb(node.args[0])
        if fname in ("resolve", "absolute", "expanduser") and isinstance(f, ast.Attribute):
            return _path_climb(f.value)
        if fname == "dirname" and node.args:
            return up(_path_climb(node.args[0]), 1)
        return None
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return up(_path_climb(node.value), 1)
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)):
        return up(_path_climb(node.value.value), 1 + node.slice.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        out = _path_climb(node.left)
        if out is not None and isinstance(node.right, ast.Constant) and isinstance(
                node.right.value, str):
            for part in node.right.value.split("/"):
                if part not in ("", "."):
                    out = up(out, 1 if part == ".." else -1)
        return out
    return None


def paths_above_repo(path: Path, text: str, repo: Path = REPO) -> list[int]:
    """Lines where a path above the repository root is built from __file__."""
    depth = len(path.resolve().parent.relative_to(repo.resolve()).parts)  # dirs below the root
    lines = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.expr):
            climb = _path_climb(node)
            if climb is not None and climb[1] > depth:
                lines.add(node.lineno)
    return sorted(lines)


def reference_files() -> list[Path]:
    out = [REPO / f for f in REFERENCE_FILES if (REPO / f).is_file()]
    for d in REFERENCE_DIRS:
        out += sorted(p for p in (REPO / d).rglob("*") if p.suffix in (".py", ".md") and p.is_file()
                      and "__pycache__" not in p.parts and ".egg-info" not in str(p))
    return [p for p in out if p.resolve() != THIS_FILE]


def reference_violations(path: Path, text: str) -> list[str]:
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    bad = []
    sibling = _sibling_paths()
    check_paths = path.resolve() != SHARED_DATA_LOCATOR
    for n, line in enumerate(text.splitlines(), 1):
        for m in STALE_DESIGN.finditer(line):
            bad.append(f"{rel}:{n}: names the old design file ({m.group(0)!r}; now docs/design.md)")
        if not check_paths:
            continue
        for m in SHARED_BY_PATH.finditer(line):
            bad.append(f"{rel}:{n}: a path outside the repository ({m.group(0)!r}; take the "
                       "shared_data fixture)")
        if sibling is not None:
            for m in sibling.finditer(line):
                bad.append(f"{rel}:{n}: an absolute path outside the repository")
    if check_paths and path.suffix == ".py":
        bad += [f"{rel}:{n}: builds a path above the repository root from __file__"
                for n in paths_above_repo(path, text)]
    return bad


def test_path_climb_detector(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests" / "sub").mkdir(parents=True)
    src = ("from pathlib import Path\nimport os\n"
           "A = Path(__file__).resolve().parents[1]\n"            # repo/: fine
           "B = Path(__file__).resolve().parents[1].parent\n"     # above: bad
           "C = Path(__file__).parent.parent / 'x' / '..'\n"      # repo/: fine
           "D = Path(__file__).parent / '../..' / 'shared'\n"      # above: bad
           "E = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))\n"  # repo/: fine
           "F = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))\n"  # above: bad
           "G = Path('x').parent.parent.parent\n")                 # not from __file__
    f = repo / "tests" / "t.py"
    f.write_text(src)
    assert paths_above_repo(f, src, repo) == [4, 6, 8]
    g = repo / "tests" / "sub" / "t.py"  # one level deeper: every path stays inside
    assert paths_above_repo(g, src, repo) == []
    assert paths_above_repo(repo / "t.py", src, repo) == [3, 4, 5, 6, 7, 8]


def test_reference_patterns():
    for text in ("see DESIGN.md §2", "(DESIGN §4)", "DESIGN section 3", "DESIGN.md"):
        assert STALE_DESIGN.search(text), text
    for text in ("docs/design.md §2", "the design", "DESIGNER", "design section"):
        assert not STALE_DESIGN.search(text), text
    for text in ("../shared/data", "in shared/data/SOURCES.md", "'../shared'"):
        assert SHARED_BY_PATH.search(text), text
    for text in ("shared_data / 'cogs'", "the shared data directory", "'../f'",
                 "x/shared/data", "unshared/data"):
        assert not SHARED_BY_PATH.search(text), text


def test_no_stale_design_or_outside_paths():
    files = reference_files()
    assert any(p.name == "conftest.py" for p in files) and any(p.suffix == ".md" for p in files)
    bad = []
    for path in files:
        bad += reference_violations(path, path.read_text(encoding="utf-8"))
    assert not bad, (f"{len(bad)} reference(s) to the old design file or to paths outside the "
                     "repository:\n" + "\n".join(bad))
