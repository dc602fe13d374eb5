"""Lab 5: an eviction priority.

Run it:  python -m paged_np lab eviction --solution labs/05_eviction.py

A finished request's full pages stay in the prefix cache (CACHED: no block table
holds them, a later prompt may reuse them). When an allocation finds no free
page, one of them gives its K/V up. Which one is the policy's choice, written as
one function, ``priority(entry)``: the page with the smallest key goes first.
Each entry carries three stamps of the cache's logical clock:

    hit_count          prefix hits that reused the page since it was made
    last_access_time   when it was last released, matched or marked used
    creation_time      when its contents entered the cache

You write two things:

- ``priority``: LFU with LRU among equals. Fewest hits first; of pages with as
  many hits, the one used longest ago. (A key that ties leaves the order to
  chance.)
- ``choose_victim``: the page to evict now. You are shown *every* page the index
  holds, with ``ref_count(page_id)``: how many block tables hold it. A page in use
  must never be evicted: a running sequence still reads its K/V.

The lab serves SmolLM2 and a toy workload in a cramped cache and checks that your
policy evicts exactly the pages the package's LFU does, in the same order.
"""


def priority(entry):
    """A sortable key for a CACHED page: the smallest key is evicted first."""
    raise NotImplementedError        # your code here (one line)


def choose_victim(entries, ref_count, priority):
    """The page id to evict: of the ``entries`` no block table holds, the smallest priority.

    entries: every page the index holds (each with page_id and the three stamps);
    ref_count(page_id) -> int; priority(entry) -> key (yours, above).
    """
    raise NotImplementedError        # your code here (about two lines)
