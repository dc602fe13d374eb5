"""The tiers below the arena, built from :class:`EngineConfig` for one engine.

A plug-in of the engine, imported only when ``host_cache_memory`` or
``disk_cache_dir`` is set: :func:`attach_tiers` builds the host pool and the
disk store the options name (:data:`paged_np.registry.KV_TIERS`) and hangs
them under the cache as ``cache.tiers`` (:class:`paged_np.cache.tiers.KVTiers`).

The engine's part is what the cache cannot know: **which model computed a
page**. The disk tier files pages under a fingerprint
(:mod:`paged_np.cache.disk_tier`), to which :func:`model_fingerprint` adds
the model's identity: the SHA-256 of its checkpoint file (the one
:func:`paged_np.load_model` read, recorded as ``model.source``) or of its
weights (a model built in memory), its weight quantization, and its config
(layers, heads, RoPE theta, norms, ...). Not in it: the attention backend
(the backends agree to 1e-5, as two batch compositions do in one process).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument
from ..registry import KV_TIERS, TIER_WRITE_POLICIES

__all__ = ["attach_tiers", "file_sha256", "model_fingerprint"]


def attach_tiers(cache, config, model):
    """Build the tiers ``config`` names for ``cache`` (of ``model``); returns ``cache.tiers``."""
    from ..cache.tiers import KVTiers

    cfg, policy = cache.cfg, config.tier_eviction_policy
    host = disk = None
    if config.host_cache_memory is not None:
        host = KV_TIERS.load("host")(cfg, config.host_cache_memory, policy)
    if config.disk_cache_dir is not None:
        memory = config.disk_cache_memory or config.DEFAULT_DISK_CACHE_MEMORY
        disk = KV_TIERS.load("disk")(cfg, config.disk_cache_dir, memory,
                                     model_fingerprint(model), policy)
    write_through = TIER_WRITE_POLICIES[config.disk_write_policy].write_through
    cache.tiers = KVTiers(cache, host, disk, config.tier_reuse_gate, write_through)
    return cache.tiers


def model_fingerprint(model) -> dict:
    """What of ``model`` decides its K/V: its weights' identity, quantization and config."""
    source = getattr(model, "source", None)        # (path, quantization), from load_model
    if source is not None:
        path, quantization = source
        weights = file_sha256(path)
    else:
        weights, quantization = weights_sha256(model), "none"
    return {"model_sha256": weights, "quantization": str(quantization),
            "model_class": type(model).__name__,
            "model_config": dataclasses.asdict(model.cfg)}


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    stamp = Path(path + ".sha256")                 # the hub's, after a verified download
    try:
        if stamp.stat().st_mtime_ns >= mtime_ns:
            digest = stamp.read_text().strip()
            if len(digest) == 64:
                return digest
    except OSError:
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path) -> str:
    """SHA-256 (hex) of a checkpoint file: its ``.sha256`` stamp when one is newer than
    the file (written by :func:`paged_np.models.hub.fetch_model` after checking it),
    else read (about 0.25 s for SmolLM2's 98 MB), once per process."""
    path = os.fspath(path)
    st = os.stat(path)
    return _file_sha256(path, st.st_size, st.st_mtime_ns)


def weights_sha256(model) -> str:
    """SHA-256 (hex) of a float model's weight arrays, by name (a model made in memory)."""
    h = hashlib.sha256()
    for name in sorted(model.w):
        w = model.w[name]
        if not isinstance(w, np.ndarray):
            raise InvalidArgument(
                f"disk_cache_dir: cannot fingerprint weight {name!r} "
                f"({type(w).__name__}); load the model with paged_np.load_model")
        h.update(f"{name}{w.shape}{w.dtype}".encode())
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()
