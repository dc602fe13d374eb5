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
