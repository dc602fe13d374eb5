"""The package's import graph, read from the source: no cycles, no private names across modules.

The graph is built with :mod:`ast` from every ``.py`` file under ``paged_np/``,
without importing anything, so it sees what a run may never reach:

- every ``import`` and ``from ... import`` statement, at module level, inside
  functions and methods (a lazy import still closes a cycle: it only moves the
  failure to the first call), inside ``try``/``if`` blocks; the only ones left
  out are those under ``if TYPE_CHECKING:``, which never run;
- ``importlib.import_module("paged_np....")`` with a literal name (names built at
  run time, e.g. from a registry's table of strings, cannot be read statically);
- relative imports resolved to absolute module names.

The nodes are modules; a package is the node of its ``__init__.py``. An edge
``A -> B`` means that running A's code executes (or reads the namespace of) B:

- ``import paged_np.x.y`` and ``from paged_np.x import y`` where ``y`` is a
  submodule: an edge to ``paged_np.x.y``;
- ``from paged_np.x import name`` where ``name`` is not a submodule: an edge to the
  package ``paged_np.x`` (its ``__init__`` defines or re-exports ``name``). So a
  cycle through an ``__init__`` that re-exports a submodule counts: it is a real
  import-order hazard (whichever module is imported first sees the other half
  initialised);
- the parent packages Python initialises on the way to a submodule are not
  edges: every submodule would otherwise point at its own package, and every
  package that re-exports its submodules would be a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "paged_np"
ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450


# ------------------------------------------------------------------ the graph
def module_files(root: Path, package: str) -> dict[str, Path]:
    """Module name -> source file, for every ``.py`` under ``root / package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(importer: str, is_pkg: bool, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the statements under ``if TYPE_CHECKING:`` (they never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            t = node.test
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) \
                else None
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    skip.update(id(n) for n in ast.walk(sub))
    return skip


class Import:
    """One imported thing: the module it lands on, and the name taken from it (if any)."""

    def __init__(self, target: str, name: str | None, lineno: int, bound: str | None):
        self.target, self.name, self.lineno, self.bound = target, name, lineno, bound

    def __repr__(self):
        return f"Import({self.target!r}, {self.name!r}, line {self.lineno})"


def imports_of(importer: str, path: Path, modules: set[str], package: str) -> list[Import]:
    """Every import in ``path`` of a module of ``package``, resolved against ``modules``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _type_checking_nodes(tree)
    is_pkg = _is_package(path)
    out: list[Import] = []

    def deepest(name: str) -> str | None:
        """The longest prefix of the dotted ``name`` that is one of our modules."""
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in modules:
                return cand
        return None

    def in_package(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if in_package(alias.name) and (target := deepest(alias.name)):
                    # ``import a.b.c`` binds ``a``; ``import a.b.c as m`` binds m to a.b.c
                    bound = alias.asname
                    out.append(Import(target, None, node.lineno, bound))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(importer, is_pkg, node.level, node.module)
            if not in_package(base):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:                  # a submodule: an edge to it
                    out.append(Import(sub, None, node.lineno, alias.asname or alias.name))
                elif (target := deepest(base)):     # a name from a module or an __init__
                    out.append(Import(target, alias.name, node.lineno, None))
        elif isinstance(node, ast.Call):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
                else None
            if fname == "import_module" and node.args \
                    and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                name = node.args[0].value
                if name.startswith("."):
                    dots = len(name) - len(name.lstrip("."))
                    name = _resolve(importer, is_pkg, dots, name.lstrip(".") or None)
                if in_package(name) and (target := deepest(name)):
                    out.append(Import(target, None, node.lineno, None))
    return out


def import_edges(root: Path, package: str) -> dict[tuple[str, str], list[int]]:
    """(importer, imported) -> the lines of the importer that make the edge (no self-edges)."""
    files = module_files(root, package)
    names = set(files)
    edges: dict[tuple[str, str], list[int]] = {}
    for mod, path in files.items():
        for imp in imports_of(mod, path, names, package):
            if imp.target != mod:
                edges.setdefault((mod, imp.target), []).append(imp.lineno)
    return {e: sorted(set(lines)) for e, lines in edges.items()}


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (no self-edges)."""
    graph = {m: set() for m in module_files(root, package)}
    for a, b in import_edges(root, package):
        graph[a].add(b)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative, so no recursion limit)."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        return v, iter(sorted(graph[v]))

    for root in sorted(graph):
        if root in index:
            continue
        work = [visit(root)]
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    work.append(visit(w))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    comps.append(comp)
    return comps


def knots(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that hold a cycle, each sorted."""
    return sorted(sorted(c) for c in strongly_connected(graph)
                  if len(c) > 1 or c[0] in graph[c[0]])


def shortest_cycle(graph: dict[str, set[str]], knot: list[str]) -> list[str]:
    """``[a, b, ..., a]``: the shortest cycle through the knot's first module (breadth first)."""
    members, start = set(knot), knot[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for u in frontier:
            for w in sorted(graph[u] & members):
                if w == start:                        # closed: walk back to start
                    path = [start]
                    while u != start:
                        path.append(u)
                        u = prev[u]
                    return [start] + path[1:][::-1] + [start]
                if w not in prev:
                    prev[w] = u
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")   # a knot always has one


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per knot, so the message names a path to follow."""
    return [shortest_cycle(graph, k) for k in knots(graph)]


def cycle_report(root: Path, package: str) -> str:
    """Each knot: one cycle with the importing lines, then every module caught in it."""
    edges = import_edges(root, package)
    graph = import_graph(root, package)
    files = module_files(root, package)
    lines = []
    for knot in knots(graph):
        cyc = shortest_cycle(graph, knot)
        hops = [f"{a} ({files[a].relative_to(root)}:{','.join(map(str, edges[a, b]))})"
                for a, b in zip(cyc, cyc[1:])]
        lines.append("  " + " -> ".join(hops + [cyc[-1]]))
        if len(knot) > len(cyc) - 1:
            lines.append(f"    the same knot holds {len(knot)} modules: {', '.join(knot)}")
    return "\n".join(lines)


def private_imports(root: Path, package: str) -> list[str]:
    """``importer:line imports _name from module`` for every private name crossing modules.

    A private name is one with a single leading underscore (dunders such as
    ``__version__`` are public). Counted: ``from .x import _y``, and
    ``m._y`` where ``m`` is bound by an import to one of the package's modules.
    A private *submodule* imported by its own package is not a name crossing
    modules and is allowed.
    """
    files = module_files(root, package)
    names = set(files)
    found = []

    def private(n: str) -> bool:
        return n.startswith("_") and not (n.startswith("__") and n.endswith("__"))

    for mod, path in files.items():
        imps = imports_of(mod, path, names, package)
        aliases = {}
        for imp in imps:
            if imp.name is not None and private(imp.name) and imp.target != mod:
                found.append((mod, imp.lineno, f"imports {imp.name} from {imp.target}"))
            if imp.bound is not None and imp.name is None:
                aliases[imp.bound] = imp.target
        if not aliases:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and private(node.attr) \
                    and aliases[node.value.id] != mod:
                found.append((mod, node.lineno, f"uses {node.value.id}.{node.attr} "
                                                f"from {aliases[node.value.id]}"))
    return [f"{mod}:{line} {what}" for mod, line, what in sorted(set(found))]


def long_modules(root: Path, package: str, limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in module_files(root, package).values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root)}: {n} lines")
    return sorted(out)


# ------------------------------------------------------------ the package itself
def test_no_import_cycles():
    cycles = find_cycles(import_graph(ROOT, PACKAGE))
    if cycles:
        pytest.fail(f"{len(cycles)} import cycle(s) in {PACKAGE} "
                    f"(module (file:lines of the import) -> ...):\n"
                    + cycle_report(ROOT, PACKAGE), pytrace=False)


def test_no_private_name_imported_across_modules():
    found = private_imports(ROOT, PACKAGE)
    if found:
        pytest.fail("private names imported across modules:\n"
                    + "\n".join("  " + f for f in found), pytrace=False)


def test_no_module_over_450_lines():
    long = long_modules(ROOT, PACKAGE)
    if long:
        pytest.fail(f"modules over {MAX_LINES} lines:\n" + "\n".join("  " + s for s in long),
                    pytrace=False)


# ------------------------------------------------- the builder, on a planted package
def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def _clean_package(tmp_path):
    return _write(tmp_path, {
        "pkg/__init__.py": "from .core import thing\nfrom . import util\n__version__ = '1'\n",
        "pkg/core.py": "from .util import helper\nimport os\n\ndef thing():\n    return helper()\n",
        "pkg/util.py": "import json\n\ndef helper():\n    return 1\n",
        "pkg/sub/__init__.py": "from .leaf import leaf\n",
        "pkg/sub/leaf.py": "from ..core import thing\nfrom .. import __version__\n"
                           "from typing import TYPE_CHECKING\n"
                           "if TYPE_CHECKING:\n    from pkg.sub import leaf as _l\n"
                           "def leaf():\n    return thing()\n",
    })


def test_builder_resolves_relative_absolute_and_submodule_imports(tmp_path):
    g = import_graph(_clean_package(tmp_path), "pkg")
    assert g == {
        "pkg": {"pkg.core", "pkg.util"},
        "pkg.core": {"pkg.util"},
        "pkg.util": set(),
        "pkg.sub": {"pkg.sub.leaf"},
        # ``from .. import __version__`` reads pkg/__init__; the TYPE_CHECKING import is skipped
        "pkg.sub.leaf": {"pkg.core", "pkg"},
    }
    assert find_cycles(g) == []                   # no false positive
    assert private_imports(tmp_path, "pkg") == []  # __version__ is a dunder, not private


def test_builder_finds_a_cycle_through_a_function_level_import(tmp_path):
    root = _clean_package(tmp_path)
    _write(root, {"pkg/util.py": "def helper():\n    from .core import thing  # lazy\n"
                                 "    return 1\n"})
    assert find_cycles(import_graph(root, "pkg")) == [["pkg.core", "pkg.util", "pkg.core"]]


def test_builder_finds_a_cycle_through_a_package_init(tmp_path):
    root = _clean_package(tmp_path)
    # pkg/__init__ re-exports core.thing; core reading pkg's namespace closes the loop.
    _write(root, {"pkg/core.py": "import pkg\nfrom .util import helper\n\n"
                                 "def thing():\n    return helper()\n"})
    assert find_cycles(import_graph(root, "pkg")) == [["pkg", "pkg.core", "pkg"]]


def test_builder_finds_a_longer_cycle_and_import_module_literals(tmp_path):
    root = _clean_package(tmp_path)
    _write(root, {
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "from pkg.c import x\n",
        "pkg/c.py": "import importlib\nx = 1\n"
                    "def load():\n    return importlib.import_module('pkg.a')\n",
    })
    assert find_cycles(import_graph(root, "pkg")) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    # a shortcut back makes a shorter cycle; the report still names the whole knot and lines
    _write(root, {"pkg/b.py": "from pkg.c import x\n\ndef f():\n    import pkg.a\n"})
    g = import_graph(root, "pkg")
    assert knots(g) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert find_cycles(g) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert cycle_report(root, "pkg").splitlines() == [
        "  pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:4) -> pkg.a",
        "    the same knot holds 3 modules: pkg.a, pkg.b, pkg.c",
    ]


def test_private_names_are_named_with_their_importer(tmp_path):
    root = _clean_package(tmp_path)
    _write(root, {
        "pkg/util.py": "def helper():\n    return 1\n\ndef _secret():\n    return 2\n",
        "pkg/core.py": "from .util import helper\nfrom . import util\n\n"
                       "def thing():\n    from .util import _secret\n"
                       "    return helper() + util._secret()\n",
    })
    assert private_imports(root, "pkg") == [
        "pkg.core:5 imports _secret from pkg.util",
        "pkg.core:6 uses util._secret from pkg.util",
    ]


def test_long_modules_are_named(tmp_path):
    root = _clean_package(tmp_path)
    _write(root, {"pkg/big.py": "x = 1\n" * (MAX_LINES + 1)})
    assert long_modules(root, "pkg") == [f"pkg/big.py: {MAX_LINES + 1} lines"]
