"""Write docs/reading.md: the files of one engine step in reading order, with their sizes.

    python docs/make_reading.py           # rewrite docs/reading.md
    python docs/make_reading.py --check   # exit 1 if docs/reading.md is stale

What a step needs is the *module-level import closure* of ``paged_np/engine/engine.py``:
the modules its import statements name, the modules theirs name, and so on. The rule,
read from the source with ``ast`` (nothing is imported):

- only statements at module level count, including those inside a module-level ``if``
  or ``try``; an import inside a function or class runs when it is called, not when the
  module loads, so it is not on the path;
- ``import a.b`` counts module ``a.b`` (a package's ``__init__.py`` when ``a.b`` is one);
- ``from a.b import x`` counts ``a.b`` and, when ``a/b/x.py`` (or ``a/b/x/``) exists,
  module ``a.b.x`` too; relative imports (``from ..c import y``) resolve against the
  importing module's package;
- a parent package that Python runs on the way to a submodule (``import a.b.c`` runs
  ``a/__init__.py``) does not count: that is a side effect of where the file sits, not
  an import its author wrote;
- only modules found under the root directory are followed (NumPy is not ours to read).

The order is topological, each module after the modules it imports, with ties broken by
package (the core's reading order: cache, attention, models, engine) and then by name.
``tests/test_reading.py`` checks that the page is current and that the closures stay
under their caps.
"""

from __future__ import annotations

import argparse
import ast
import heapq
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reading.md"

# The closures the page lists: one engine step, and the cache on its own.
STEP = "paged_np.engine.engine"
CACHE = "paged_np.cache.kv_cache"

# Ties in the topological order go to the earlier package: the top-level modules
# (config, errors, ...) first, then the core in the order paged_np/__init__.py gives.
PACKAGE_ORDER = ("", "cache", "attention", "quant", "models", "engine")


def module_path(module: str, root: Path = ROOT) -> Path | None:
    """The file of a dotted module name under root: ``a/b.py`` or ``a/b/__init__.py``."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module loads: top level, or nested in a
    module-level ``if``/``try`` (any branch); never inside a def or class."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            todo.extend(node.body + node.orelse)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            todo.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                todo.extend(handler.body)
    return found


def imports_of(module: str, root: Path = ROOT) -> list[str]:
    """The modules under root that ``module`` imports at module level, in source order."""
    path = module_path(module, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in _module_level_imports(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
            continue
        if node.level:                         # relative: from the importing package
            package = module.split(".") if is_package else module.split(".")[:-1]
            if node.level > 1:
                package = package[:-(node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module
        names.append(base)
        names.extend(f"{base}.{alias.name}" for alias in node.names
                     if module_path(f"{base}.{alias.name}", root) is not None)
    seen: dict[str, None] = {}
    for name in names:
        if name != module and module_path(name, root) is not None:
            seen.setdefault(name)
    return list(seen)


def _rank(module: str, root: Path = ROOT) -> tuple:
    """Tie-break key: package in PACKAGE_ORDER (others after, by name), then the name."""
    parts = module.split(".")
    if module_path(module, root).name == "__init__.py":
        parts = parts + ["__init__"]          # paged_np.cache sits in package "cache"
    package = parts[1] if len(parts) > 2 else ""
    known = package in PACKAGE_ORDER
    return (0 if known else 1, PACKAGE_ORDER.index(package) if known else 0, package, module)


def closure(module: str, root: Path = ROOT) -> list[tuple[str, Path, int]]:
    """``module`` and every module it reaches by module-level imports, in reading order.

    Returns ``[(dotted name, path, line count), ...]``: each module after the modules
    it imports (a cycle, which the package forbids, is cut at its first name), ties
    broken by package order and then by name.
    """
    if module_path(module, root) is None:
        raise ValueError(f"no module {module!r} under {root}")
    deps: dict[str, list[str]] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in deps:
            deps[name] = imports_of(name, root)
            todo.extend(deps[name])
    # Kahn's algorithm: a module is ready once everything it imports is placed.
    waiting = {name: set(d) for name, d in deps.items()}
    users: dict[str, list[str]] = {name: [] for name in deps}
    for name, d in deps.items():
        for dep in d:
            users[dep].append(name)
    ready = [(_rank(n, root), n) for n, w in waiting.items() if not w]
    heapq.heapify(ready)
    order: list[str] = []
    while len(order) < len(deps):
        if not ready:                          # a cycle: take the first of what is left
            name = min((n for n in waiting if n not in order), key=lambda n: _rank(n, root))
            waiting[name].clear()
            heapq.heappush(ready, (_rank(name, root), name))
        _, name = heapq.heappop(ready)
        if name in order:
            continue
        order.append(name)
        for user in users[name]:
            waiting[user].discard(name)
            if not waiting[user] and user not in order:
                heapq.heappush(ready, (_rank(user, root), user))
    result = []
    for name in order:
        path = module_path(name, root)
        result.append((name, path, len(path.read_text().splitlines())))
    return result


#: Run in a fresh process: one float32 step of the NumPy backend, then print every module of
#: the package it loaded (its own imports, and the defaults it loaded by name from the
#: registries) and whether Numba was imported at all.
_STEP_SCRIPT = """
import sys
import paged_np as pnp
model = pnp.LlamaModel.random(pnp.ModelConfig(), seed=0)
engine = pnp.Engine(model, num_pages=16, page_size=4, backend="numpy")
engine.generate([[1, 2, 3, 4, 5, 6]], pnp.SamplingParams(max_tokens=3, temperature=0.0))
print("numba" in sys.modules)
print(" ".join(sorted(m for m in sys.modules if m == "paged_np" or m.startswith("paged_np."))))
"""


def step_modules(root: Path = ROOT) -> tuple[list[tuple[str, Path, int]], bool]:
    """``(modules, numba_loaded)`` of one float32 NumPy-backend step run in a fresh
    process: every module of the package it loaded, in reading order, with its lines."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", _STEP_SCRIPT], env=env, cwd=root, check=True,
                         capture_output=True, text=True).stdout.split("\n")
    names = sorted(out[1].split(), key=lambda m: _rank(m, root))
    return [(m, module_path(m, root), len(module_path(m, root).read_text().splitlines()))
            for m in names], out[0] == "True"


def _summary(path: Path) -> str:
    """The first line of the module's docstring, as Markdown for a table cell."""
    doc = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    line = doc.splitlines()[0] if doc else ""
    line = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", line)      # Sphinx roles: :mod:`x` -> `x`
    line = line.replace("``", "`")                          # reST literals -> Markdown
    return line.replace("|", "\\|")


def _table(module: str, rows=None) -> list[str]:
    rows = closure(module) if rows is None else rows
    total = sum(n for _, _, n in rows)
    lines = [
        f"**{len(rows)} modules, {total:,} lines.**",
        "",
        "| # | file | lines | what it is |",
        "|---|---|---|---|",
    ]
    for i, (_, path, n) in enumerate(rows, 1):
        rel = path.relative_to(ROOT).as_posix()
        lines.append(f"| {i} | `{rel}` | {n:,} | {_summary(path)} |")
    lines.append(f"| | **total** | **{total:,}** | |")
    return lines


def render() -> str:
    """The text of docs/reading.md, computed from the source as it stands."""
    return "\n".join([
        "# Reading order: the files of one step",
        "",
        "<!-- Written by `python docs/make_reading.py`; do not edit by hand. "
        "tests/test_reading.py fails when it is stale. -->",
        "",
        "The files of one engine step: first the module-level import closure of",
        "`paged_np/engine/engine.py`, computed from the source with `ast` (imports inside",
        "functions run only when called, so they are not on the path). Read it top to",
        "bottom: each file comes after the files it imports, the core's packages in the",
        "order cache, attention, models, engine. The rule is in the docstring of",
        "`docs/make_reading.py`.",
        "",
        "The engine reaches its seams by name (`paged_np/registry.py`): the cache class,",
        "the scheduler, the sampler, the step, the prefix index, the eviction policy and",
        "the attention backend are the registry entries its config names, loaded when",
        "chosen. So the last table is measured, not read: every module of the package",
        "that one float32 step of the NumPy backend loads in a fresh process, package",
        "faces (`__init__.py`) included. None of it is Numba, the radix tree, quantized",
        "weights, 8-bit pages, speculative decoding, swap, logprobs, the tokenizer or the",
        "server: those are plug-ins, loaded when chosen.",
        "",
        "## One engine step: `paged_np/engine/engine.py`",
        "",
        *_table(STEP),
        "",
        "## The cache on its own: `paged_np/cache/kv_cache.py`",
        "",
        "What `PagedKVCache` needs, read first when you study the memory model alone.",
        "",
        *_table(CACHE),
        "",
        "## What one float32 NumPy step loads, measured",
        "",
        "The default step (`EngineConfig(backend=\"numpy\")`, a float32 model, the hash",
        "index and LRU) run once in a fresh process; every module of the package in",
        "`sys.modules` afterwards.",
        "",
        *_table(STEP, step_modules()[0]),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/reading.md differs from what this writes")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python docs/make_reading.py",
                  file=sys.stderr)
            return 1
        print(f"{PAGE.relative_to(ROOT)} is current")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
