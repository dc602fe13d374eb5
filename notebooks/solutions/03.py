"""Solutions to notebook 3's exercises (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 3
# After mark_used(order[0]) the line is order[1:] + [order[0]]. The hit on systems[1] takes
# its pages (order[3:6]) out of the line, which leaves order[1] at the old end.
next_victim = order[1]

# %% exercise 3b
# Leaves were last used in the order q0, q1, q2, q3; serving q0 again makes its path the
# youngest, which leaves q1's leaf the least recently used.
next_leaf = "q1"

# %% exercise 3c
def cached_prefix(index, token_ids, page_size):
    """Page ids of the longest cached prefix of token_ids (whole pages), in order."""
    parent, pages = ROOT_HASH, []
    for i in range(len(token_ids) // page_size):      # full pages only
        tokens = token_ids[i * page_size:(i + 1) * page_size]
        parent = hash_page(parent, tokens)
        page = index.lookup(parent, tokens)
        if page is None:
            break
        pages.append(page)
    return pages

# %% exercise 3d
class MyLFU(pnp.EvictionPolicy):
    name = "my-lfu"

    def priority(self, entry):
        return (entry.hit_count, entry.last_access_time)   # fewest hits, then oldest
