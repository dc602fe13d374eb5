"""Lab 1, slots on a free list: ``allocate(free_list)`` and ``slot_mapping(...)``.

The learner writes the two smallest pieces of the allocator: taking a page off
the free list, and turning a block table into the slots where the next
tokens' K/V go (``slot = block_table[t // page_size] * page_size + t % page_size``,
an int64: a big arena has more than 2**31 slots).

How they enter the engine: the lab's cache class (a :class:`~paged_np.PagedKVCache`
subclass, registered in ``KV_CACHES``) builds its page pool from a
:class:`~paged_np.cache.page_pool.PagePool` subclass whose ``allocate`` takes a FREE
page with the learner's ``allocate`` (evicting a cached page stays the
package's: that is lab 5), and its ``allocate_slots`` returns the learner's
``slot_mapping`` of the pages the package just gave the sequence. Each answer
is checked where it is used, against the package's, so a wrong slot is
refused at the step that computed it, before its K/V lands anywhere.
"""

from __future__ import annotations

import numpy as np

from ..cache.page_pool import PagePool
from ..cache.sequence import slots_of
from ..checks import check_int
from ..errors import DTypeError
from .report import LabFailure, expect, show

TITLE = "slots on a free list"
FILE = "01_slots.py"
FUNCTIONS = ("allocate", "slot_mapping")
BLAME = "slot_mapping"

HINTS = {
    "allocate": (
        "The free list is the pages no block table holds and no prefix needs. Taking "
        "one is all an allocation does here; the caller counts the reference.",
        "free_list.pop() takes the top of the stack (the page freed last). Return the "
        "page id; the list must lose exactly that page."),
    "slot_mapping": (
        "A page holds page_size consecutive positions of one sequence; the block table "
        "says which page holds the i-th run. Position t is in run t // page_size, at "
        "offset t % page_size, and a slot numbers every (page, offset) of the arena.",
        "positions = np.arange(start, start + n); pages = np.asarray(block_table, "
        "np.int64)[positions // page_size]; return pages * page_size + positions % "
        "page_size  (int64 before the multiply: page ids times page_size overflow int32)."),
}


def call_allocate(learner, free_list: list) -> int:
    """The learner's page, checked: one page that was on the list, and only it gone."""
    before = list(free_list)
    case = f"free_list={before}"
    page = learner.call("allocate", free_list, case=case)
    try:
        page = check_int("page", page)
    except DTypeError:
        raise LabFailure("allocate", f"returned {show(page)}: a page id (an int) is due",
                         case) from None
    if page not in before:
        raise LabFailure("allocate", f"returned page {page}, which is not on the free list "
                                     "(a page someone holds would be handed out twice)", case)
    rest = list(before)
    rest.remove(page)
    if list(free_list) != rest:
        raise LabFailure("allocate", [f"returned page {page}, and left free_list = "
                                      f"{list(free_list)}",
                                      f"the list must lose exactly that page: {rest}"], case)
    return page


def call_slot_mapping(learner, block_table, start: int, n: int, page_size: int) -> np.ndarray:
    """The learner's slots, checked against the package's (``slots_of``)."""
    case = f"block_table={list(block_table)}, start={start}, n={n}, page_size={page_size}"
    got = learner.call("slot_mapping", list(block_table), start, n, page_size, case=case)
    want = slots_of(list(block_table), start, n, page_size)
    arr = np.asarray(got)
    if arr.dtype.kind not in "iu":
        raise LabFailure("slot_mapping", [f"returned {show(got)}", "slots are integers "
                                          f"(int64), one per position: expected {show(want)}"],
                         case)
    expect("slot_mapping", case, arr.astype(np.int64).reshape(-1) if arr.size == n else arr,
           want, why="slot = block_table[t // page_size] * page_size + t % page_size, "
                     "for t = start .. start + n - 1")
    return want


def check(learner, rng) -> None:
    """Random cases, then hidden ones (page_size 1, int64 slots, runs over many pages)."""
    for _ in range(30):
        free = [int(p) for p in rng.permutation(int(rng.integers(1, 12)))]
        call_allocate(learner, free)
    for _ in range(40):
        ps = int(rng.choice([1, 2, 4, 8, 16]))
        start = int(rng.integers(0, 5 * ps))
        n = int(rng.integers(1, 4 * ps + 2))
        pages = -(-(start + n) // ps)
        table = [int(p) for p in rng.permutation(max(pages, 1) + 6)[:pages]]
        call_slot_mapping(learner, table, start, n, ps)
    call_slot_mapping(learner, [3], 3, 1, 4)                      # the last slot of a page
    call_slot_mapping(learner, [5, 2], 4, 1, 4)                   # the first of the next
    call_slot_mapping(learner, [2**29, 7], 14, 4, 16)             # slots past 2**31: int64


def swap(learner):
    """The lab's cache class: the learner's ``allocate`` and ``slot_mapping`` inside."""
    from .runner import Swap

    class LabPool(PagePool):
        def allocate(self, seq_id=None):
            if not self._free:                   # nothing free: evict (the package's)
                return super().allocate(seq_id)
            p = call_allocate(learner, self._free)
            self._ref[p] = 1
            self._emit("allocate", p, seq_id)
            return p

    class SlotsCache:
        def __init__(self, cfg, *args, **kwargs):
            super().__init__(cfg, *args, **kwargs)
            self.pool = LabPool(cfg.num_pages, cfg.page_size, self.prefix_index)
            self.pool.listener = self._log

        def allocate_slots(self, seq_id, n):
            super().allocate_slots(seq_id, n)
            seq = self.sequence(seq_id)
            return call_slot_mapping(learner, seq.block_table, seq.num_computed_tokens, n,
                                     self.page_size)

    return Swap(cache_mixins=[SlotsCache])
