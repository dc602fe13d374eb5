"""Lab 1, solved: slots on a free list. Try the lab (labs/01_slots.py) first."""

import numpy as np


def allocate(free_list):
    """Take one page off ``free_list`` and return its id (an int)."""
    return free_list.pop()                                  # the top of the stack


def slot_mapping(block_table, start, n, page_size):
    """The slots of positions ``start .. start + n - 1``: int64 array ``[n]``."""
    positions = np.arange(start, start + n, dtype=np.int64)            # [n]
    pages = np.asarray(block_table, dtype=np.int64)[positions // page_size]  # [n]
    return pages * page_size + positions % page_size                   # [n] int64
