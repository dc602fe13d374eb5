"""Lab 1: slots on a free list.

Run it:  python -m paged_np lab slots --solution labs/01_slots.py

The paged KV cache keeps every token's keys and values in one preallocated
arena, cut into pages of ``page_size`` token slots. A sequence owns a *block
table*: the list of its pages, in order. Two small functions make that work,
and you write both:

- ``allocate(free_list)``: take one page off the free list;
- ``slot_mapping(block_table, start, n, page_size)``: the slots where the K/V
  of positions ``start .. start + n - 1`` go.

The lab puts them inside the engine's cache (every page the engine takes from
its free list, and every slot it writes, comes from your code), serves SmolLM2
and a toy workload, and accepts them when every token equals the package's.
"""

import numpy as np  # noqa: F401  (you will want it)


def allocate(free_list):
    """Take one page off ``free_list`` and return its id (an int).

    ``free_list`` is a Python list of page ids that no block table holds. Change
    it in place: the page you return must leave the list (and nothing else may).
    The package keeps it as a stack, taking the page at the end (the one freed
    last); any page of the list is correct here.
    """
    raise NotImplementedError        # your code here (one line)


def slot_mapping(block_table, start, n, page_size):
    """The slots of positions ``start .. start + n - 1``: int64 array ``[n]``.

    ``block_table`` lists the sequence's pages in order (a list of ints): its
    ``i``-th page holds positions ``i * page_size .. (i + 1) * page_size - 1``.
    A slot numbers one (page, offset) of the arena: ``page * page_size + offset``.
    Slots are int64: an arena may hold more than 2**31 of them.
    """
    raise NotImplementedError        # your code here (about three lines)
