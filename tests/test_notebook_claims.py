"""Claims the notebooks make about the package, checked against it, and four wrong
claims of earlier versions kept out (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paged_np.cache.page_pool import PagePool

SRC = Path(__file__).resolve().parents[1] / "notebooks" / "_src"


def test_the_free_list_is_a_stack():
    """Notebook 1: the last page given back is the first handed out (LIFO); a fresh
    pool hands out pages in increasing order only because nothing was freed yet."""
    pool = PagePool(6, 4)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    pool.free(1)
    pool.free(3)
    assert pool.allocate() == 3 and pool.allocate() == 1 and pool.allocate() == 4


@pytest.mark.parametrize("notebook, wrong", [
    ("01_pages_arena_block_tables", "in the order the allocator hands them out"),
    ("05_serving_continuous_batching", "turns the same memory traffic into more tokens"),
    ("06_numba_kernels_and_performance", "FlashInfer's default"),
    ("08_real_model_on_the_paged_cache", "seed's"),
])
def test_the_old_wrong_claims_stay_out(notebook, wrong):
    assert wrong not in (SRC / f"{notebook}.py").read_text()


def test_the_online_softmax_keeps_the_running_output():
    """Notebook 2 teaches the one-pass loop with m, l and acc, rescaled together."""
    text = (SRC / "02_paged_attention_step_by_step.py").read_text()
    assert "acc   = alpha * acc + p @ V" in text and "out = acc / l" in text
