"""Solutions to notebook 1's exercises (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercises first.
"""

# %% exercise 1a
n_pages = -(-len(d_prompt) // P)                  # 9 tokens in pages of 4: ceil -> 3
free_after = len(next_free) - n_pages
# token 8 is on D's page 8 // P (its third page), at offset 8 % P
slot_of_last = next_free[n_pages - 1] * P + (len(d_prompt) - 1) % P

# %% exercise 1b
def waste_fraction(lengths, page_size):
    """Fraction of reserved slots left empty: lengths [n] int, page_size P -> float."""
    reserved = np.sum(-(-lengths // page_size)) * page_size   # whole pages per request
    return 1 - lengths.sum() / reserved

# %% exercise 1c
def allocate_slots(free, block_table, num_tokens, n, page_size):
    """Slots of tokens num_tokens .. num_tokens + n - 1; pops pages off `free` as needed."""
    slots = []
    for t in range(num_tokens, num_tokens + n):
        if t // page_size == len(block_table):     # the last page is full: a fresh one
            block_table.append(free.pop())         # the top of the stack
        slots.append(block_table[t // page_size] * page_size + t % page_size)
    return slots
