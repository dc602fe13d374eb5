"""The one set of argument checks (``paged_np/checks.py``) and that it is the only one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np.checks import check_int, check_positive_int

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(3), np.uint8(3)])
def test_check_int_returns_a_python_int(value):
    got = check_int("x", value, 0, 4)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [True, np.bool_(False), 2.0, np.float32(1), "3", None, [1]])
def test_check_int_refuses_what_is_not_an_integer(value):
    with pytest.raises(pnp.DTypeError, match=r"^x must be an int, got "):
        check_int("x", value)


def test_check_int_bounds_pick_the_error_class():
    with pytest.raises(pnp.InvalidArgument, match=r"^count must be >= 1, got 0$") as e:
        check_positive_int("count", 0)
    assert type(e.value) is pnp.InvalidArgument
    with pytest.raises(pnp.InvalidArgument, match=r"^top_k must be >= -1, got -2$"):
        check_int("top_k", -2, low=-1)
    with pytest.raises(pnp.IndexOutOfRange, match=r"^layer 4 is outside \[0, 4\)$"):
        check_int("layer", 4, 0, 4)
    with pytest.raises(pnp.IndexOutOfRange, match=r"^page_id -1 is outside \[0, 8\)$"):
        check_int("page_id", np.int64(-1), high=8)
    assert check_int("n", -5) == -5          # no bounds: only the type is checked


@pytest.mark.parametrize("call, message", [
    (lambda: pnp.CacheConfig(num_pages=2.0), "CacheConfig.num_pages must be an int"),
    (lambda: pnp.ModelConfig(num_heads=0), "ModelConfig.num_heads must be >= 1"),
    (lambda: pnp.PagePool(0, 16), "PagePool.num_pages must be >= 1"),
    (lambda: pnp.PagePool(4, 16).ref_count(4), r"page_id 4 is outside \[0, 4\)"),
    (lambda: pnp.SamplingParams(n=True), "SamplingParams.n must be an int"),
    (lambda: pnp.SamplingParams(seed=-1), "SamplingParams.seed must be >= 0"),
    (lambda: pnp.PagedKVCache(pnp.CacheConfig(num_pages=4)).layer(1),
     r"layer 1 is outside \[0, 1\)"),
])
def test_public_entries_use_the_shared_checks(call, message):
    with pytest.raises(pnp.PagedNPError, match=message):
        call()


# Kernel-side re-validation belongs to the attention backends' own issue (14, item 1);
# everything else checks scalar ints through paged_np/checks.py.
ALLOWED = {"paged_np/checks.py", "paged_np/attention/numba_cuda.py"}
HAND_WRITTEN = re.compile(r"must be an int\b(?!eger)|isinstance\(\w+, \(int, np\.integer\)\)")


def test_no_hand_written_int_validator_outside_checks():
    found = []
    for path in sorted((ROOT / "paged_np").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if HAND_WRITTEN.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "int checks outside paged_np/checks.py:\n" + "\n".join(found)
