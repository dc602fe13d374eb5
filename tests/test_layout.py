"""The folders show the architecture, and the repository stands on its own.

- Import direction, read from every module's ``import`` statements (``ast``, both
  ``paged_np.x`` and relative forms, at any depth, including imports inside
  functions): nothing outside ``cli/`` imports from ``cli/``, and nothing in
  ``cache/`` imports from ``engine/``, ``models/``, ``sim/`` or ``viz/``.
- Every name in ``paged_np.__all__`` imports.
- No text file in the repository points at a file outside it (the old upper-case
  design contract, the workspace's common folder, an absolute path into the
  workspace, a relative path that climbs out).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import paged_np

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "paged_np"


def _module_name(path: Path) -> str:
    """``paged_np/cache/arena.py`` -> ``paged_np.cache.arena`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of everything ``path`` imports from inside ``paged_np``.

    ``from . import x`` counts as importing ``package.x`` (it may be a module), and
    ``from .m import f`` as importing ``package.m``.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == "paged_np" or m.startswith("paged_np.")}


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _subpackage(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_import_parser_sees_every_form(tmp_path, monkeypatch):
    """The checker itself: absolute, relative, nested-in-a-function and ``from . import``."""
    pkg = tmp_path / "paged_np" / "cache"
    pkg.mkdir(parents=True)
    mod = pkg / "probe.py"
    mod.write_text(
        "import paged_np.sim.workloads\n"
        "from ..engine import Engine\n"
        "from .. import viz\n"
        "from .arena import Arena\n"
        "def f():\n"
        "    from paged_np.models.llama import LlamaModel\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = imported_modules(mod)
    assert {"paged_np.sim.workloads", "paged_np.engine", "paged_np.viz",
            "paged_np.cache.arena", "paged_np.models.llama"} <= got
    assert {_subpackage(m) for m in got} >= {"sim", "engine", "viz", "models", "cache"}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_import_direction(path):
    here = _subpackage(_module_name(path))
    used = {_subpackage(m) for m in imported_modules(path)}
    if here != "cli" and path.name != "__main__.py":
        assert "cli" not in used, f"{path.relative_to(ROOT)} imports from paged_np.cli"
    if here == "cache":
        bad = used & {"engine", "models", "sim", "viz"}
        assert not bad, f"{path.relative_to(ROOT)} (the cache) imports from {sorted(bad)}"


def test_main_reaches_cli_only_lazily():
    """``__main__`` dispatches to ``cli`` by name, inside a function, never at import."""
    tree = ast.parse((PKG / "__main__.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in top:
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
            a.name for a in node.names]
        assert not any("cli" in n.split(".") for n in names), ast.unparse(node)


@pytest.mark.parametrize("name", paged_np.__all__)
def test_every_public_name_imports(name):
    ns: dict = {}
    exec(f"from paged_np import {name}", ns)
    assert ns[name] is getattr(paged_np, name)


def test_all_lists_the_public_names_once():
    assert len(set(paged_np.__all__)) == len(paged_np.__all__)
    exported = {n for n in dir(paged_np) if not n.startswith("_")
                and not isinstance(getattr(paged_np, n), type(paged_np))}
    assert exported == set(paged_np.__all__) - {"__version__"}


# ---------------------------------------------------------------- outside files
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".yml", ".yaml", ".toml"}
# Every pattern is built from pieces, so this file itself names no outside path.
OLD_CONTRACT = "DES" + "IGN" + ".md"
SHARED_DIR, WORKSPACE = "sha" + "red" + "/", "/" + "work" + "/"
UP = "." + "./"                                                 # one directory up
OUTSIDE = [
    (re.compile(re.escape(OLD_CONTRACT)), "the old design contract (now docs/design.md)"),
    (re.compile(r"(?<![\w.])" + SHARED_DIR), "the workspace's common folder"),
    (re.compile(WORKSPACE), "an absolute path on the build machine"),
]
UP_PATH = re.compile(r"(?<![\w.])((?:" + re.escape(UP) + r")+[\w.-][\w./-]*)")


def _repo_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [ROOT / f for f in out.splitlines()]
    return [f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file()]


def _text(path: Path) -> str:
    """The text a reader sees: for a notebook, its cells' sources (not outputs)."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n".join("".join(c["source"]) for c in cells)
    return path.read_text()


def outside_references(path: Path, text: str) -> list[str]:
    found = [f"{m.group(0)!r} ({why})" for pat, why in OUTSIDE for m in pat.finditer(text)]
    for m in UP_PATH.finditer(text):
        target = (path.parent / m.group(1)).resolve()
        if not target.is_relative_to(ROOT):
            found.append(f"{m.group(1)!r} (climbs out of the repository)")
    return found


def test_the_outside_reference_check_can_fail(tmp_path):
    inside = ROOT / "docs" / "concepts" / "x.md"
    outside_style = WORKSPACE + SHARED_DIR + "STYLE.md"
    text = (f"see {OLD_CONTRACT} and {outside_style}, then [a](" + UP * 3 + "other/x.md);"
            f" but [b]({UP}index.md) is fine")
    found = outside_references(inside, text)
    assert len(found) == 4, found   # old contract, common folder, the workspace, the climb
    assert not any("index.md" in f for f in found)


def test_no_reference_to_a_file_outside_the_repository():
    this = Path(__file__).resolve()
    problems = []
    for path in _repo_text_files():
        if path == this:
            continue  # this file names the patterns it looks for
        for ref in outside_references(path, _text(path)):
            problems.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not problems, "references to files outside the repository:\n" + "\n".join(problems)


# ------------------------------------------------------------ cross-references
XREF = re.compile(r":(?:mod|func|class|meth|attr|data):`~?(paged_np(?:\.\w+)+)`")
NEEDS_CUDA = "paged_np.attention.numba_cuda"   # importing it needs numba.cuda (or its simulator)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_docstring_cross_references_name_modules_that_exist():
    """A ``:func:`paged_np.x.f``` left behind by a move would point nowhere."""
    assert not _resolves("paged_np.simulate.run")       # the check can fail
    broken = []
    for path in _repo_text_files():
        if path.suffix not in (".py", ".md") or path == Path(__file__).resolve():
            continue
        for ref in XREF.findall(path.read_text()):
            if not ref.startswith(NEEDS_CUDA) and not _resolves(ref):
                broken.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not broken, "cross-references to names that do not exist:\n" + "\n".join(broken)
