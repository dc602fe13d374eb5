"""The documentation site stays complete: every public name has a reference entry, every
page in the nav exists, every notebook is in the nav, every included file exists.

These checks read ``mkdocs.yml`` and ``docs/`` as text, so they run without the docs
extra installed; CI's ``mkdocs build --strict`` then checks links, anchors and the
rendering itself.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import paged_np

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"


def _nav_paths() -> list[str]:
    """Files named in the nav: entries ending in .md or .ipynb."""
    text = MKDOCS.read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^\n]*?:\s+)?([\w./-]+\.(?:md|ipynb))\s*$", nav, re.M)


def _reference_targets() -> set[str]:
    """Dotted paths rendered with ``::: paged_np.X`` anywhere under docs/."""
    targets = set()
    for page in DOCS.rglob("*.md"):
        targets.update(re.findall(r"^:::\s*(paged_np[\w.]*)\s*$", page.read_text(), re.M))
    return targets


def test_every_public_name_is_in_the_api_reference():
    targets = _reference_targets()
    missing = []
    for name in dir(paged_np):
        obj = getattr(paged_np, name)
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        # Rendered by name, or as a member of its module's rendered page.
        if f"paged_np.{name}" not in targets and getattr(obj, "__module__", None) not in targets:
            missing.append(name)
    assert not missing, f"public names with no '::: paged_np.NAME' in docs/: {missing}"


def test_reference_targets_exist():
    """A '::: paged_np.x.y' that no longer resolves would fail the strict build anyway;
    catching it here names the page. Modules are found without importing them (the
    cuda backend refuses to import without a GPU)."""
    import importlib
    import importlib.util

    for target in sorted(_reference_targets()):
        parts = target.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
            try:
                spec = importlib.util.find_spec(".".join(parts[:cut]))
            except ImportError:
                spec = None
            if spec is None:
                continue
            obj = importlib.import_module(".".join(parts[:cut])) if cut < len(parts) else None
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"{target}: {'.'.join(parts[:cut])} has no {attr}"
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"{target}: no such module")


def test_nav_files_exist():
    paths = _nav_paths()
    assert "index.md" in paths and len(paths) > 10, paths
    for p in paths:
        # Notebooks are taken from the repository's notebooks/ by docs/hooks.py.
        where = ROOT / p if p.endswith(".ipynb") else DOCS / p
        assert where.is_file(), f"mkdocs.yml nav names {p}, but {where} does not exist"


def test_every_docs_page_and_notebook_is_in_the_nav():
    nav = set(_nav_paths())
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert not (pages - nav), f"pages missing from the mkdocs.yml nav: {sorted(pages - nav)}"
    assert not (notebooks - nav), f"notebooks missing from the nav: {sorted(notebooks - nav)}"


def test_included_files_exist():
    for page in DOCS.rglob("*.md"):
        for inc in re.findall(r'^--8<--\s+"([^"]+)"', page.read_text(), re.M):
            assert (ROOT / inc).is_file(), f"{page.name} includes {inc}, which does not exist"
