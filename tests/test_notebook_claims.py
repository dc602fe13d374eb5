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


# ---------------------------------------------------- issue 44's corrections, kept in
ROOT = SRC.parents[1]


def _src(stem: str) -> str:
    return next(SRC.glob(f"{stem}_*.py")).read_text()


@pytest.mark.parametrize("stem", ["01", "04", "05"])
def test_a_v0_and_v1_box_where_the_free_list_and_copy_on_write_are_taught(stem):
    text = _src(stem)
    assert "**vLLM V0 and V1.**" in text
    assert "no copy-on-write" in text and "FIFO" in text and "LRU order" in text


@pytest.mark.parametrize("stem", ["05", "08"])
def test_batch_invariance_is_taught_where_recompute_is(stem):
    text = _src(stem)
    assert "batch invariance" in text.lower() and "batch-invariant" in text


@pytest.mark.parametrize("stem, wrong, right", [
    ("01", "Why must a sequence's pages not be neighbours", "Why need a sequence's pages"),
    ("02", "its last one sees one more key per row", "each later query one more key"),
    ("03", "an inner node's KV is useless without its parent's", "strand its whole subtree"),
    ("05", "find the latest earlier place", "vLLM takes its **earliest** occurrence"),
    ("05", "read TTFT", "(Latency, TTFT, TPOT and ITL, is\n# notebook 8's.)"),
    ("05", "can do tens of times more arithmetic", "a GPU\n# hundreds"),
    ("06", "tens of FLOPs per byte it can fetch, so", "a GPU hundreds"),
    ("07", "four **warps** of 32 that run in", "Only a\n# warp's 32 threads run in lock-step"),
    ("08", "as\n# vLLM's `gpu_memory_utilization` does", "vLLM's `kv_cache_memory_bytes` does"),
    ("08", "LRU over live pages", "(first in, first out, over *every* page)"),
    ("08", "blog", "runs[\"3 FIFO evicts live pages\"]"),
    ("09", "tens of flops in the time it takes to read one float\n# from memory, so",
     "a GPU hundreds"),
    ("10", "one scale per *token*", "keeps one scale per *tensor*"),
])
def test_the_corrections_are_in_the_sources(stem, wrong, right):
    text = _src(stem)
    assert wrong.lower() not in text.lower() if wrong == "blog" else wrong not in text
    assert right in text


@pytest.mark.parametrize("stem", ["09", "10"])
def test_09_and_10_have_objectives_and_self_checks(stem):
    text = _src(stem)
    assert "**What you need:**" in text and "**What you will be able to do:**" in text
    assert "## Self-check" in text and text.count("<details><summary>answer") >= 4


def test_the_capstone_counts_the_notebooks_and_the_proposer_names_vllms_occurrence():
    readme = (ROOT / "notebooks" / "capstone" / "README.md").read_text()
    assert "eight notebooks" not in readme and "After the ten notebooks" in readme
    doc = (ROOT / "paged_np" / "engine" / "spec_decode.py").read_text()
    assert "*earliest* occurrence" in doc and '"latest occurrence, longest n' not in doc
