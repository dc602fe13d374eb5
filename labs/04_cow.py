"""Lab 4: copy-on-write.

Run it:  python -m paged_np lab cow --solution labs/04_cow.py

A request with ``n = 3`` samples computes its prompt once; then the three
samples *fork*: their block tables list the same pages, and each page's
``ref_count`` says how many tables hold it. Reading a shared page costs
nothing. Writing into one would change what the other samples read, so the
first write into a shared page copies it first. You write both halves:

- ``pages_to_copy``: which entries of a block table an allocation of ``n`` tokens
  from position ``start`` writes into *and* shares with another table;
- ``copy_on_write``: the copy itself, given two callbacks: ``copy_page(src, dst)``
  copies a page's K/V (every layer) and ``drop(page)`` gives up this sequence's
  reference to a page.

The lab plugs them into the engine's cache and serves SmolLM2 and a toy
workload in which some requests sample several answers (seeded, so every token
must equal the package's).

(This is vLLM V0's design. vLLM V1 has no copy-on-write: its ``n > 1`` is n
requests sharing full pages through the prefix cache.)
"""


def pages_to_copy(block_table, ref_counts, start, n, page_size):
    """Indices i of ``block_table`` to copy before tokens ``start .. start + n - 1`` are written.

    block_table: the sequence's pages (a list of ints); ref_counts[i]: how many block
    tables hold page block_table[i]. The tokens may need pages the table does not have
    yet (those are fresh, never shared). Return a list of indices, ascending.
    """
    raise NotImplementedError        # your code here (about three lines)


def copy_on_write(block_table, i, dst, copy_page, drop):
    """Give the sequence its own copy of its shared page ``block_table[i]`` in page ``dst``.

    Change ``block_table`` in place; return nothing. Mind the order: the shared page
    must stay held until its K/V is copied.
    """
    raise NotImplementedError        # your code here (about four lines)
