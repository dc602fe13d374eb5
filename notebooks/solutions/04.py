"""Solutions to notebook 4's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 4
# 12 tokens fill three pages exactly: each new token goes to a fresh page of its own
# sequence and nothing shared is written, so no copy. The three shared pages are stored
# once, plus one fresh page for each of the six sequences.
cow = 0
in_use = 3 + 6

# %% exercise 4b
def allocate_with_cow(block_table, ref_counts, free, num_tokens, n, page_size):
    """-> (new block_table, [(src, dst), ...]) for n more tokens; pops pages off free."""
    first, need = num_tokens // page_size, -(-(num_tokens + n) // page_size)
    cow = [i for i in range(first, min(len(block_table), need))
           if ref_counts[block_table[i]] > 1]                  # shared pages we write into
    fresh = [free.pop() for _ in range(len(cow) + max(0, need - len(block_table)))]
    copies = []
    for i, dst in zip(cow, fresh):                            # copies take the first pages
        copies.append((block_table[i], dst))
        block_table[i] = dst
    return block_table + fresh[len(cow):], copies
