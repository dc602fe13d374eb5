"""Lab 4, copy-on-write: ``pages_to_copy(...)`` decides, ``copy_on_write(...)`` copies.

After a fork (``n > 1`` samples of one prompt), several block tables hold the
same pages. Reading a shared page is free; *writing* into one would change
what the other holders read. So before an allocation's tokens are written,
every page they land in that another table also holds (``ref_count > 1``) is
copied into a fresh page, and the writer's table points at the copy.

The learner writes both halves: the decision (which block-table entries this
allocation writes into *and* shares) and the action (copy the K/V, point the
table at the copy, drop this sequence's reference to the shared page, in
that order: once dropped, the last other holder may free the page and a new
owner overwrite it while the copy is still being read).

How they enter the engine: the lab's cache class (a
:class:`~paged_np.PagedKVCache` subclass in ``KV_CACHES``) takes the list of
pages to copy from the learner when it plans an allocation (the cache's
``_plan``, which also sizes it), and the cache's ``copy_on_write`` seam runs
the learner's action with the arena's page copy and the pool's ``free`` as
its two callbacks. Both are checked where they run.

Compared with vLLM: this is vLLM V0's block manager. V1 has no copy-on-write:
``n > 1`` is n requests that share full pages through prefix caching, and
each writes its partial last page into a page of its own.
"""

from __future__ import annotations

from .report import LabFailure, expect, show

TITLE = "copy-on-write"
FILE = "04_cow.py"
FUNCTIONS = ("pages_to_copy", "copy_on_write")
BLAME = "pages_to_copy"

HINTS = {
    "pages_to_copy": (
        "The tokens start .. start + n - 1 land in the pages start // page_size up to the "
        "last one they need. Of those the table already has, a page another table also "
        "holds (ref_count > 1) must be copied before anything is written: the first of "
        "them is often the partly filled last page, shared since the fork.",
        "first = start // page_size; need = -(-(start + n) // page_size); return [i for i "
        "in range(first, min(len(block_table), need)) if ref_counts[i] > 1]."),
    "copy_on_write": (
        "Copy first, then repoint, then let go: the shared page must stay held while its "
        "K/V is read. Its other holders keep their reference; only this sequence drops one.",
        "src = block_table[i]; copy_page(src, dst); block_table[i] = dst; drop(src)."),
}


def call_pages_to_copy(learner, block_table, ref_counts, start, n, page_size, want) -> list:
    """The learner's list, checked against ``want`` (the package's)."""
    case = (f"block_table={list(block_table)}, ref_counts={list(ref_counts)}, start={start}, "
            f"n={n}, page_size={page_size}")
    got = learner.call("pages_to_copy", list(block_table), list(ref_counts), start, n,
                       page_size, case=case)
    try:
        mine = sorted(int(i) for i in got)
    except (TypeError, ValueError):
        raise LabFailure("pages_to_copy", f"returned {show(got)}: a list of block-table "
                                          "indices is due", case) from None
    missed = [i for i in want if i not in mine]
    why = (f"block_table[{missed[0]}] = page {block_table[missed[0]]} is held by "
           f"{ref_counts[missed[0]]} block tables and these tokens write into it: "
           "written without a copy, the other holders would read this sequence's K/V"
           if missed else "")
    expect("pages_to_copy", case, mine, list(want), why=why)
    return mine


def call_copy_on_write(learner, block_table: list, i: int, dst: int, copy_page, drop) -> None:
    """The learner's action with strict callbacks: each misuse refused as it happens."""
    before = list(block_table)
    src = before[i]
    case = f"block_table={before}, i={i}, dst={dst} (the shared page is {src})"
    done = []

    def my_copy(a, b):
        if (a, b) != (src, dst):
            raise LabFailure("copy_on_write", f"called copy_page({a}, {b}); the copy goes from "
                                              f"the shared page {src} into the fresh page "
                                              f"{dst}: copy_page({src}, {dst})", case)
        if "copy" in done:
            raise LabFailure("copy_on_write", "copied the page twice", case)
        done.append("copy")
        copy_page(a, b)

    def my_drop(p):
        if p != src:
            raise LabFailure("copy_on_write", f"called drop({p}); drop the shared page "
                                              f"{src}: the fresh page {dst} is this "
                                              "sequence's own now", case)
        if "copy" not in done:
            raise LabFailure("copy_on_write", "dropped the shared page before copying it: "
                                              "once dropped, its last other holder may free "
                                              "it and a new owner overwrite it mid-copy", case)
        if "drop" in done:
            raise LabFailure("copy_on_write", "dropped the shared page twice: it would be "
                                              "freed while its other holders still read it",
                             case)
        done.append("drop")
        drop(p)

    learner.call("copy_on_write", block_table, i, dst, my_copy, my_drop, returns=False,
                 case=case)
    want = before[:i] + [dst] + before[i + 1:]
    if list(block_table) != want:
        raise LabFailure("copy_on_write", [f"left block_table = {list(block_table)}",
                                           f"expected {want}: entry {i} points at the copy"],
                         case)
    if "copy" not in done:
        raise LabFailure("copy_on_write", "never called copy_page: the fresh page would hold "
                                          "whatever its last owner left there", case)
    if "drop" not in done:
        raise LabFailure("copy_on_write", f"never called drop({src}): the shared page keeps "
                                          "a reference no block table holds (a leak)", case)


class CowMixin:
    """The lab's cache: the learner decides what to copy and does the copy."""

    cow_learner = None

    def _plan(self, seq, n):
        pages_needed, cow, n_new = super()._plan(seq, n)
        bt = list(seq.block_table)
        refs = [self.pool.ref_count(p) if p >= 0 else 0 for p in bt]
        mine = call_pages_to_copy(self.cow_learner, bt, refs, seq.num_computed_tokens, n,
                                  self.page_size, cow)
        return pages_needed, mine, n_new

    def copy_on_write(self, seq, i, dst):
        call_copy_on_write(self.cow_learner, seq.block_table, i, dst, self._arena.copy_page,
                           lambda p: self.pool.free(p, seq.seq_id))
        self._cow_copies += 1
        self._log("cow", dst, seq.seq_id)


def check(learner, rng) -> None:
    """Random fork states in a real cache (what its allocation copies), then the action."""
    import paged_np as pnp

    ps = 4
    for _ in range(25):
        c = pnp.PagedKVCache(pnp.CacheConfig(num_pages=40, page_size=ps, head_dim=4),
                             record_events=False)
        ids = list(range(int(rng.integers(1, 3 * ps))))
        c.add_sequence("p", ids)
        c.allocate_slots("p", len(ids))
        c.append_tokens("p", ids)
        for k in range(int(rng.integers(1, 4))):                 # samples share p's pages
            c.fork("p", f"s{k}")
        for sid in list(c.seq_ids)[:int(rng.integers(0, 3))]:    # some have written since
            m = int(rng.integers(1, ps + 2))
            c.allocate_slots(sid, m)
            c.append_tokens(sid, [7] * m)
        sid = str(rng.choice(c.seq_ids))
        n = int(rng.integers(1, 2 * ps + 2))
        bt = [int(p) for p in c.block_table(sid)]
        refs = [c.pool.ref_count(p) for p in bt]
        start = c.num_computed_tokens(sid)
        c.allocate_slots(sid, n)                                 # the package's answer:
        after = [int(p) for p in c.block_table(sid)]             # the entries it replaced
        want = [i for i, (a, b) in enumerate(zip(bt, after)) if a != b]
        call_pages_to_copy(learner, bt, refs, start, n, ps, want)
    for _ in range(10):
        table = [int(p) for p in rng.permutation(20)[:int(rng.integers(1, 6))]]
        i = int(rng.integers(len(table)))
        dst = 20 + int(rng.integers(10))
        call_copy_on_write(learner, table, i, dst, lambda a, b: None, lambda p: None)


def swap(learner):
    from .runner import Swap

    return Swap(cache_mixins=[type("LabCow", (CowMixin,), {"cow_learner": learner})])
