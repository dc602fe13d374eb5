"""The disk tier: pages kept in files under a directory, found again after a restart.

Pages the host tier evicts (or every page as it is computed, with
``disk_write_policy="write_through"``) are written here, one file per page,
named by the page hash (the process-stable SHA-256 chain of its prefix)::

    <disk_cache_dir>/
      <fingerprint, 16 hex>/          one folder per fingerprint (see below)
        FINGERPRINT.json              the fingerprint in words, for a person
        <page hash, 64 hex>.kv        one page, every layer, K and V (and scales)

A file is a fixed preamble, a JSON header and the page's bytes as the arena
stores them::

    b"PNPKVPG\\n"  u32 header length  u32 crc32(header)  header (JSON)  payload

The header repeats the fingerprint's digest, the page hash, the page's token
ids, the payload's dtype, shapes, length and crc32. The **fingerprint** is
everything that makes a page's K/V valid for the engine reading it: the model
(its file's SHA-256, or its weights' digest, its config with the RoPE
layout, its weight quantization), the layer count, kv heads, head dim, page
size, the KV format, the page layout (``kv_layout``: the K half's bytes mean
``[page_size, head_dim]`` or ``[head_dim, page_size]``) and
:data:`PAGE_FORMAT_VERSION`. A different model or
format has another folder and so never sees these files; a file moved into
the wrong folder fails the header check.

**Faults are misses.** A file that is truncated, fails its checksum, names
another fingerprint, hash or tokens, or cannot be read is not loaded: the
page is recomputed, the fault counted (``faults``, by kind in ``fault_kinds``)
and warned about once, and the bad file removed. A write that fails (a full
disk, a quota, a read-only directory) stores nothing and is counted the same
way. Writes go to a temporary file renamed over the final name, so a crash
mid-write leaves no half page under a page's name (and a page the rename did
not make durable fails its checksum). No ``fsync``: the checksum, not the
disk's ordering, decides whether a page loads.

Why one file per page rather than a few large memory-mapped files: the
rename makes each page atomic on its own, a bad sector costs one page, and
eviction is ``unlink`` (no allocator, free map or compaction inside a big
file). The cost is a few system calls per page, small against a page's
bytes (SmolLM2: 720 KiB float32, 196 KiB int8). LMCache's local disk backend
and llama.cpp's slot files make the same choice.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import warnings
import zlib
from itertools import count
from pathlib import Path

import numpy as np

from ..checks import parse_bytes
from .tier_index import TierIndex

#: Bumped whenever the file layout or the meaning of a page's bytes changes.
PAGE_FORMAT_VERSION = 1
MAGIC = b"PNPKVPG\n"
_PREAMBLE = struct.Struct("<8sII")          # magic, header length, crc32 of the header
SUFFIX = ".kv"
#: A temporary file older than this belongs to no live writer: removed at start.
STALE_TMP_S = 3600.0


def fingerprint_digest(fingerprint: dict) -> str:
    """The SHA-256 (hex) of a fingerprint, written as sorted JSON."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


class DiskStore:
    """Pages shaped like ``cfg``'s in files under ``directory``, up to ``memory`` bytes.

    ``fingerprint``: what the caller adds to the cache's shape and format (the
    model's identity; see :func:`paged_np.engine.tiering.model_fingerprint`).
    Pages a previous process stored under the same directory and fingerprint
    are found at construction (by name only: a file is read when it is hit).
    """

    name = "disk"

    def __init__(self, cfg, directory, memory, fingerprint: dict, policy="lru"):
        self.memory = parse_bytes(memory, "disk_cache_memory")
        shape = cfg.arena_shape
        self.page_shape = (shape[0], 2, *shape[3:])              # [L, 2, Hkv, ps, D]
        self.scales_shape = self.page_shape[:-1] if cfg.quantized else None
        self.dtype = np.dtype(cfg.dtype)
        self.fingerprint = {"page_format_version": PAGE_FORMAT_VERSION,
                            "num_layers": shape[0], "num_kv_heads": shape[3],
                            "page_size": shape[4], "head_dim": shape[5],
                            "kv_format": cfg.kv_format, "kv_layout": cfg.kv_layout,
                            **fingerprint}
        self.digest = fingerprint_digest(self.fingerprint)
        self.dir = Path(directory).expanduser() / self.digest[:16]
        self.index = TierIndex(policy)
        self.bytes = 0
        self.hits = self.stores = self.evictions = 0
        self.fault_kinds: dict[str, int] = {}
        self._tmp_ids = count()
        self._open()

    # ------------------------------------------------------------------ start
    def _open(self) -> None:
        """Make the folder (or find it) and index the pages already in it, oldest first."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            note = self.dir / "FINGERPRINT.json"
            if not note.exists():
                note.write_text(json.dumps(self.fingerprint, indent=1, sort_keys=True) + "\n")
        except OSError as e:
            self._fault("unwritable", f"cannot prepare {self.dir}: {e}")
        try:
            names = list(self.dir.iterdir())
        except OSError:
            names = []
        found = []
        for p in names:
            try:
                st = p.stat()
                if p.name.endswith(".tmp"):               # a writer died mid-page
                    if time.time() - st.st_mtime > STALE_TMP_S:
                        p.unlink(missing_ok=True)
                elif p.suffix == SUFFIX and len(p.stem) == 64:
                    found.append((st.st_mtime_ns, bytes.fromhex(p.stem), st.st_size))
            except (OSError, ValueError):                 # gone meanwhile, or not a hash
                continue
        kept, total = [], 0
        for entry in sorted(found, reverse=True):          # the newest first
            if total + entry[2] > self.memory:             # a smaller budget than last time:
                try:                                       # the oldest pages go
                    self.path(entry[1]).unlink(missing_ok=True)
                except OSError:
                    pass
                continue
            kept.append(entry)
            total += entry[2]
        for rank, (_, page_hash, size) in enumerate(reversed(kept)):   # oldest, oldest time
            self.index.add(page_hash, (), size, time=rank - len(kept))
            self.bytes += size

    # ----------------------------------------------------------------- pages
    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self.index

    def path(self, page_hash: bytes) -> Path:
        return self.dir / (page_hash.hex() + SUFFIX)

    def load(self, page_hash: bytes, token_ids) -> tuple | None:
        """``(data [L, 2, Hkv, ps, D], scales or None)`` read from the page's file, checked
        against this store's fingerprint, the hash, the tokens and the checksum; None
        when the page is not here or its file fails a check (a counted fault)."""
        e = self.index.get(page_hash)
        if e is None:
            return None
        path = self.path(page_hash)
        try:
            raw = path.read_bytes()
        except OSError as err:
            return self._bad(page_hash, "unreadable", f"{path.name}: {err}")
        page, why = self._parse(raw, page_hash, token_ids)
        if why == "other tokens":                      # a sound page, not this prompt's
            return None
        if page is None:
            return self._bad(page_hash, why[0], f"{path.name}: {why[1]}")
        self.index.hit(e)
        self.hits += 1
        try:
            os.utime(path)                             # recency survives a restart
        except OSError:
            pass
        return page

    def _parse(self, raw: bytes, page_hash: bytes, token_ids):
        """``(page, None)``, ``(None, (fault kind, why))``, or ``(None, "other tokens")``
        for a sound file whose page holds other tokens than asked (a miss, not a fault)."""
        if len(raw) < _PREAMBLE.size:
            return None, ("truncated", "shorter than its preamble")
        magic, n, crc = _PREAMBLE.unpack_from(raw)
        head = raw[_PREAMBLE.size:_PREAMBLE.size + n]
        if magic != MAGIC or len(head) != n or zlib.crc32(head) != crc:
            kind = "truncated" if len(head) != n else "corrupt"
            return None, (kind, "bad preamble or header checksum")
        try:
            h = json.loads(head)
        except ValueError:
            return None, ("corrupt", "header is not JSON")
        if h.get("fingerprint") != self.digest:
            return None, ("fingerprint", "written for another model, format or version")
        if h.get("hash") != page_hash.hex():
            return None, ("corrupt", "holds another page")
        payload = memoryview(raw)[_PREAMBLE.size + n:]
        if len(payload) != h.get("payload_bytes"):
            return None, ("truncated", f"{len(payload)} of {h.get('payload_bytes')} bytes")
        if zlib.crc32(payload) != h.get("payload_crc32"):
            return None, ("corrupt", "payload checksum mismatch")
        if h.get("token_ids") != list(token_ids):      # the hash's tokens differ: a collision
            return None, "other tokens"
        n_data = int(np.prod(self.page_shape)) * self.dtype.itemsize
        data = np.frombuffer(payload[:n_data], self.dtype).reshape(self.page_shape)
        scales = (None if self.scales_shape is None else
                  np.frombuffer(payload[n_data:], np.float32).reshape(self.scales_shape))
        return (data, scales), None

    def store(self, page_hash: bytes, token_ids, data, scales) -> bool:
        """Write one page's file (atomically); False when it is here already, larger than
        the whole budget, or the write failed (a counted fault)."""
        if page_hash in self.index:
            return False
        parts = [np.ascontiguousarray(data, self.dtype)]
        if self.scales_shape is not None:
            parts.append(np.ascontiguousarray(scales, np.float32))
        payload = b"".join(memoryview(p).cast("B") for p in parts)
        head = json.dumps({"version": PAGE_FORMAT_VERSION, "fingerprint": self.digest,
                           "hash": page_hash.hex(), "token_ids": [int(t) for t in token_ids],
                           "dtype": self.dtype.str, "shape": self.page_shape,
                           "scales_shape": self.scales_shape, "payload_bytes": len(payload),
                           "payload_crc32": zlib.crc32(payload)}).encode()
        size = _PREAMBLE.size + len(head) + len(payload)
        if size > self.memory:
            return False
        while self.bytes + size > self.memory:
            self._evict_one()
        path = self.path(page_hash)
        tmp = path.with_name(f".{path.stem[:16]}.{os.getpid()}.{next(self._tmp_ids)}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_PREAMBLE.pack(MAGIC, len(head), zlib.crc32(head)))
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)                      # atomic: the whole page or none
        except OSError as err:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self._fault("unwritable", f"cannot write {path.name}: {err}")
            return False
        self.index.add(page_hash, tuple(token_ids), size)
        self.bytes += size
        self.stores += 1
        return True

    def _evict_one(self) -> None:
        e = self.index.pop_victim()
        self.bytes -= e.where
        self.evictions += 1
        try:
            self.path(e.hash).unlink(missing_ok=True)
        except OSError:
            pass

    # ---------------------------------------------------------------- faults
    def _bad(self, page_hash: bytes, kind: str, why: str) -> None:
        """A page that failed to load: forget it, remove its file, count and warn once."""
        e = self.index.remove(page_hash)
        if e is not None:
            self.bytes -= e.where
        try:
            self.path(page_hash).unlink(missing_ok=True)
        except OSError:
            pass
        self._fault(kind, why)
        return None

    def _fault(self, kind: str, why: str) -> None:
        first = kind not in self.fault_kinds
        self.fault_kinds[kind] = self.fault_kinds.get(kind, 0) + 1
        if first:
            warnings.warn(f"paged_np disk tier ({self.dir}): {kind}: {why}. The page is "
                          "recomputed; later faults of this kind are counted, not shown "
                          "(stats()['tiers'])", RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------- reporting
    @property
    def num_pages(self) -> int:
        return len(self.index)

    @property
    def faults(self) -> int:
        return sum(self.fault_kinds.values())

    def stats(self) -> dict:
        return {"pages": self.num_pages, "bytes": self.bytes, "capacity_bytes": self.memory,
                "hits": self.hits, "stores": self.stores, "evictions": self.evictions,
                "faults": self.faults, "fault_kinds": dict(self.fault_kinds)}

    def check_invariants(self) -> None:
        self.index.check_invariants()
        assert self.bytes == sum(e.where for e in self.index.entries()), "disk bytes drifted"
        assert self.bytes <= self.memory, "disk tier over budget"
