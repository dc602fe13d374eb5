"""One engine step stays short enough to read, and docs/reading.md says how long it is.

The closure (``docs/make_reading.py``): the modules a file imports at module level,
followed transitively, read from the source with ``ast``. Issue 43 caps one engine
step at 5,000 lines and the cache on its own at 2,000.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEP_CAP = 5_000
CACHE_CAP = 2_000


def _make_reading():
    spec = importlib.util.spec_from_file_location("make_reading", ROOT / "docs/make_reading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mr = _make_reading()


def _listing(rows) -> str:
    return "\n".join(f"  {n:5d}  {name}" for name, _, n in rows)


def test_reading_md_is_current():
    assert (ROOT / "docs/reading.md").read_text() == mr.render(), (
        "docs/reading.md is stale: run python docs/make_reading.py")


def test_one_engine_step_is_at_most_5000_lines():
    rows = mr.closure("paged_np.engine.engine")
    total = sum(n for _, _, n in rows)
    assert total <= STEP_CAP, (
        f"the module-level import closure of paged_np/engine/engine.py is {len(rows)} "
        f"modules, {total:,} lines (cap {STEP_CAP:,}):\n{_listing(rows)}")


def test_the_cache_alone_is_at_most_2000_lines():
    rows = mr.closure("paged_np.cache.kv_cache")
    total = sum(n for _, _, n in rows)
    assert total <= CACHE_CAP, (
        f"the module-level import closure of paged_np/cache/kv_cache.py is {len(rows)} "
        f"modules, {total:,} lines (cap {CACHE_CAP:,}):\n{_listing(rows)}")


#: Plug-ins a float32 NumPy step must not load: each is reached through a registry or an
#: import inside the function that needs it, only when chosen.
PLUG_INS = ("paged_np.cache.radix", "paged_np.cache.kv_quant", "paged_np.quant",
            "paged_np.attention.numba", "paged_np.attention.cuda", "paged_np.attention.split_k",
            "paged_np.models.fused", "paged_np.models.quantized", "paged_np.models.tokenizer",
            "paged_np.engine.speculation", "paged_np.engine.spec_decode",
            "paged_np.engine.rejection", "paged_np.engine.swap", "paged_np.engine.logprobs",
            "paged_np.engine.llm", "paged_np.server", "paged_np.engine.server",
            "paged_np.cache.tiers", "paged_np.cache.host_tier", "paged_np.cache.disk_tier",
            "paged_np.cache.tier_index", "paged_np.engine.tiering")


def test_a_float32_numpy_step_loads_no_plug_in_and_no_numba():
    rows, numba_loaded = mr.step_modules()
    names = [name for name, _, _ in rows]
    assert not numba_loaded, "a float32 step of the numpy backend imported Numba"
    loaded = [n for n in names if n.startswith(PLUG_INS)]
    assert not loaded, f"plug-ins loaded by a float32 NumPy step: {loaded}"
    # What it does load is the core: the cache, the hash index, the scheduler, the model.
    for core in ("paged_np.cache.kv_cache", "paged_np.cache.hash_index",
                 "paged_np.engine.scheduler", "paged_np.models.llama",
                 "paged_np.attention.numpy_paged"):
        assert core in names
    total = sum(n for _, _, n in rows)
    assert total <= 6_000, f"one float32 NumPy step loads {total:,} lines:\n{_listing(rows)}"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_closure_counts_what_runs_at_import_and_nothing_else(tmp_path):
    # A package with a case for every counting rule: absolute and relative imports (one
    # and two dots), `from pkg import module`, a package's __init__ named by
    # `from pkg import X`, imports nested in a module-level if/try (counted) and in a
    # def or class (not), an outside library (not followed), and a parent package that
    # Python runs on the way to a submodule (not counted).
    _write(tmp_path, {
        "toy/__init__.py": "from .unused import nothing\n",     # never named: not counted
        "toy/unused.py": "nothing = None\n",
        "toy/core/__init__.py": '"""The core package."""\nfrom .base import Base\n',
        "toy/core/base.py": '"""Base class."""\nimport numpy\nclass Base:\n    pass\n',
        "toy/core/util.py": '"""Helpers."""\nX = 1\n',
        "toy/core/lazy.py": '"""Imported only inside a function."""\n',
        "toy/core/classy.py": '"""Imported only inside a class body."""\n',
        "toy/core/guarded.py": '"""Imported in a module-level try."""\n',
        "toy/core/typed.py": '"""Imported in a module-level if."""\n',
        "toy/app/__init__.py": "from .leaf import Y\n",
        "toy/app/leaf.py": '"""A leaf."""\nfrom ..core.util import X\nY = X\n',
        "toy/app/top.py": (
            '"""The module we start from."""\n'
            "import toy.core.util\n"
            "from toy.core import Base\n"              # counts toy/core/__init__.py
            "from . import leaf\n"                     # toy/app/__init__.py and leaf.py
            "from .sub.deep import thing\n"            # toy.app.sub.deep alone
            "try:\n    from ..core import guarded\nexcept ImportError:\n    pass\n"
            "if True:\n    import toy.core.typed\n"
            "def f():\n    from ..core import lazy\n"
            "class C:\n    def g(self):\n        import toy.core.classy\n"
        ),
        "toy/app/sub/__init__.py": "import toy.unused\n",    # run on the way: not counted
        "toy/app/sub/deep.py": '"""Two dots up."""\nfrom ..leaf import Y\nthing = Y\n',
    })
    rows = mr.closure("toy.app.top", root=tmp_path)
    names = [name for name, _, _ in rows]
    assert sorted(names) == sorted([
        "toy.app.top", "toy.core.util", "toy.core", "toy.core.base", "toy.app",
        "toy.app.leaf", "toy.app.sub.deep", "toy.core.guarded", "toy.core.typed"])
    # Each module after what it imports; the start last (everything is below it).
    at = {name: i for i, name in enumerate(names)}
    for before, after in [("toy.core.base", "toy.core"), ("toy.core.util", "toy.app.leaf"),
                          ("toy.app.leaf", "toy.app"), ("toy.app.leaf", "toy.app.sub.deep"),
                          ("toy.core", "toy.app.top")]:
        assert at[before] < at[after], names
    assert names[-1] == "toy.app.top"
    # Line counts are the files' lines; paths are the files.
    for name, path, n in rows:
        assert path == mr.module_path(name, tmp_path)
        assert n == len(path.read_text().splitlines())
    assert {name: n for name, _, n in rows}["toy.app.top"] == 16


def test_closure_breaks_ties_by_package_order(tmp_path):
    # Four modules that import nothing: the order is the core's package order.
    _write(tmp_path, {
        "pk/__init__.py": "",
        **{f"pk/{pkg}/__init__.py": "" for pkg in ("engine", "models", "attention", "cache")},
        **{f"pk/{pkg}/m.py": "" for pkg in ("engine", "models", "attention", "cache")},
        "pk/config.py": "",
        "pk/engine/start.py": ("import pk.engine.m\nimport pk.models.m\n"
                               "import pk.attention.m\nimport pk.cache.m\nimport pk.config\n"),
    })
    names = [name for name, _, _ in mr.closure("pk.engine.start", root=tmp_path)]
    assert names == ["pk.config", "pk.cache.m", "pk.attention.m", "pk.models.m",
                     "pk.engine.m", "pk.engine.start"]
