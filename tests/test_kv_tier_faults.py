"""Faults below the arena are misses: identical tokens, a counted fault, no crash.

Each fault the disk tier can meet is injected (a truncated file, a flipped byte in
the payload or the header, a file written for another fingerprint, a directory that
refuses writes, a disk quota that a page exceeds); the engine then serves the same
greedy tokens, counts the fault, warns once, and its cache and tiers keep their
invariants. Then the tiers' own pools under hypothesis: stores, loads and evictions
never exceed the budget and never return a page for the wrong hash.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tier_helpers import check_clean, evict_and_ask, make_engine

import paged_np as pnp
from paged_np.cache import disk_tier
from paged_np.cache.disk_tier import DiskStore
from paged_np.cache.host_tier import HostPool
from paged_np.registry import EVICTION_POLICIES

ROOT = Path(__file__).resolve().parents[1]
PREAMBLE = struct.Struct("<8sII")


def _filled_dir(tmp_path) -> list[Path]:
    """Run once with a disk tier so that the directory holds the prompt's pages."""
    engine = make_engine(disk_cache_dir=str(tmp_path))
    evict_and_ask(engine)
    files = sorted(tmp_path.rglob("*.kv"))
    assert files
    return files


def _rewrite_header(path: Path, change) -> None:
    raw = path.read_bytes()
    magic, n, _ = PREAMBLE.unpack_from(raw)
    head = json.loads(raw[PREAMBLE.size:PREAMBLE.size + n])
    change(head)
    new = json.dumps(head).encode()
    path.write_bytes(PREAMBLE.pack(magic, len(new), zlib.crc32(new)) + new
                     + raw[PREAMBLE.size + n:])


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


FAULTS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-100]),
    "corrupt": lambda p: _flip(p, p.stat().st_size - 10),                  # the payload
    "corrupt_header": lambda p: _flip(p, PREAMBLE.size + 5),                # the header
    "fingerprint": lambda p: _rewrite_header(p, lambda h: h.update(fingerprint="0" * 64)),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_bad_file_is_a_counted_miss(tmp_path, fault):
    for path in _filled_dir(tmp_path):
        FAULTS[fault](path)
    engine = make_engine(disk_cache_dir=str(tmp_path))                      # a restart
    assert engine.stats()["tiers"]["disk"]["pages"] > 0
    with pytest.warns(RuntimeWarning, match=fault.split("_")[0]):
        out, dense = evict_and_ask(engine)
    assert out.token_ids == dense                                           # recomputed
    disk = engine.stats()["tiers"]["disk"]
    assert disk["faults"] >= 1 and disk["fault_kinds"].get(fault.split("_")[0], 0) >= 1
    check_clean(engine)


def test_a_directory_that_refuses_writes_counts_each_write_and_warns_once(tmp_path,
                                                                           monkeypatch):
    if os.geteuid() != 0:                   # a real read-only directory
        (tmp_path / "ro").mkdir(mode=0o500)
        directory = tmp_path / "ro"
    else:                                   # root writes anyway: refuse as a read-only fs does
        def refuse(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(disk_tier.os, "replace", refuse)
        directory = tmp_path
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine = make_engine(disk_cache_dir=str(directory))
        out, dense = evict_and_ask(engine)
    assert out.token_ids == dense
    disk = engine.stats()["tiers"]["disk"]
    assert disk["fault_kinds"]["unwritable"] > 1 and disk["stores"] == 0
    assert sum("unwritable" in str(w.message) for w in seen) == 1           # warned once
    assert not list(Path(directory).rglob("*.tmp"))                         # nothing half
    check_clean(engine)


QUOTA = r"""
import json, resource, signal, sys
sys.path.insert(0, "tests")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the quota fails (EFBIG)
from tier_helpers import evict_and_ask, make_engine, check_clean
engine = make_engine(disk_cache_dir=sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))   # smaller than one page's file
out, dense = evict_and_ask(engine)
check_clean(engine)
print(json.dumps({"same": out.token_ids == dense, "disk": engine.stats()["tiers"]["disk"]}))
"""


def test_a_disk_quota_smaller_than_a_page_is_a_counted_miss(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", QUOTA, str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["same"] and got["disk"]["stores"] == 0
    assert got["disk"]["fault_kinds"]["unwritable"] > 0
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.kv"))


def test_a_file_named_for_one_page_holding_another_is_refused(tmp_path):
    files = _filled_dir(tmp_path)
    files[0].write_bytes(files[1].read_bytes())           # the right format, the wrong page
    engine = make_engine(disk_cache_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, dense = evict_and_ask(engine)
    assert out.token_ids == dense
    check_clean(engine)


# ------------------------------------------------------------ the pools themselves
CFG = pnp.CacheConfig(num_pages=4, page_size=2, num_layers=1, num_kv_heads=1, head_dim=4)
CFG8 = pnp.CacheConfig(num_pages=4, page_size=2, num_layers=1, num_kv_heads=1, head_dim=4,
                       dtype="int8")
HASHES = [bytes([i]) * 32 for i in range(8)]
OPS = st.lists(st.tuples(st.sampled_from(["store", "load", "drop"]),
                         st.integers(0, len(HASHES) - 1)), max_size=60)


def _page(cfg, i: int, version: int):
    """A page whose every value names (hash index, version): a wrong page cannot pass."""
    shape = (cfg.num_layers, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
    data = np.full(shape, i * 10 + version % 10, dtype=cfg.dtype)
    scales = np.full(shape[:-1], i + version, np.float32) if cfg.quantized else None
    return data, scales


def _run(pool, cfg, ops, on_evict=None):
    held: dict[int, int] = {}                   # hash index -> version stored
    version = 0
    for op, i in ops:
        h, tokens = HASHES[i], (i, i + 1)
        if op == "store":
            version += 1
            data, scales = _page(cfg, i, version)
            kw = {} if on_evict is None else {"on_evict": on_evict}
            if pool.store(h, tokens, data, scales, **kw):
                held[i] = version
        elif op == "load":
            got = pool.load(h, tokens)
            if got is not None:                 # only ever the page last stored for h
                want = _page(cfg, i, held[i])
                assert np.array_equal(got[0], want[0])
                assert (got[1] is None) == (want[1] is None)
                if want[1] is not None:
                    assert np.array_equal(got[1], want[1])
            assert pool.load(h, (99, 99)) is None        # other tokens, same hash: refused
        elif hasattr(pool, "drop"):
            pool.drop(h)
        held = {j: v for j, v in held.items() if HASHES[j] in pool}
        pool.check_invariants()
        assert pool.stats()["bytes"] <= pool.stats()["capacity_bytes"]


@settings(max_examples=60, deadline=None)
@given(ops=OPS, pages=st.integers(0, 4), policy=st.sampled_from(EVICTION_POLICIES.names()),
       quantized=st.booleans())
def test_host_pool_never_exceeds_its_memory_nor_returns_a_wrong_page(ops, pages, policy,
                                                                    quantized):
    cfg = CFG8 if quantized else CFG
    pool = HostPool(cfg, max(1, pages * cfg.bytes_per_page), policy)
    evicted = []
    _run(pool, cfg, ops, on_evict=lambda h, t, d, s: evicted.append((h, t, d.copy())))
    for h, tokens, data in evicted:             # what it handed down was that hash's page
        assert tokens == (h[0], h[0] + 1) and int(data.flat[0]) // 10 == h[0]


@settings(max_examples=25, deadline=None)
@given(ops=OPS, pages=st.integers(1, 4), policy=st.sampled_from(EVICTION_POLICIES.names()))
def test_disk_store_never_exceeds_its_budget_nor_returns_a_wrong_page(ops, pages, policy):
    with tempfile.TemporaryDirectory() as d:
        probe = DiskStore(CFG, d, "1MiB", {"model": "t"})
        probe.store(HASHES[0], (0, 1), *_page(CFG, 0, 1))
        size = probe.bytes                      # one page's file
        store = DiskStore(CFG, Path(d) / "b", pages * size, {"model": "t"}, policy)
        _run(store, CFG, ops)
        again = DiskStore(CFG, Path(d) / "b", pages * size, {"model": "t"}, policy)
        assert again.num_pages == store.num_pages and again.bytes == store.bytes
        again.check_invariants()


def test_a_restart_with_a_smaller_budget_keeps_the_newest_pages(tmp_path):
    store = DiskStore(CFG, tmp_path, "1MiB", {"model": "t"})
    for i in range(4):
        store.store(HASHES[i], (i, i + 1), *_page(CFG, i, 1))
        os.utime(store.path(HASHES[i]), ns=(10**18 + i, 10**18 + i))   # written in order
    size = store.bytes // 4
    small = DiskStore(CFG, tmp_path, 2 * size, {"model": "t"})
    assert [h in small for h in HASHES[:4]] == [False, False, True, True]
    assert len(list(small.dir.glob("*.kv"))) == 2                      # the rest removed
    small.check_invariants()
    oldest = min(small.index.entries(), key=lambda e: e.last_access_time)
    assert oldest.hash == HASHES[2]                                    # LRU: it goes first
