"""The BLAS prefill path's workspace stays within its documented bound (numba_prefill)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import paged_np.attention.numba_prefill  # noqa: F401  (numba is a dependency: no skip)

_spec = importlib.util.spec_from_file_location(
    "prefill_memory", Path(__file__).resolve().parents[1] / "benchmarks/prefill_memory.py")
prefill_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prefill_memory)


def test_prefill_workspace_is_within_the_bound_and_linear_in_context():
    small, large = prefill_memory.measure(512), prefill_memory.measure(2048)
    assert small <= prefill_memory.bound_bytes(512)
    assert large <= prefill_memory.bound_bytes(2048)
    # It grows with the context (the documented exception to the rule) as the bound
    # says: the gathered K and V, and the score block S up to K_TILE keys.
    per_key = (large - small) / (2048 - 512)
    bound_per_key = (prefill_memory.bound_bytes(2048) - prefill_memory.bound_bytes(512)) / 1536
    assert 0.9 * bound_per_key < per_key < 1.1 * bound_per_key
