"""Solutions to notebook 2's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 2
def merge_pages(outs, lses):
    """outs [n_pages, D], lses [n_pages] -> the output over all pages, [D]."""
    lse = lses.max() + np.log(np.exp(lses - lses.max()).sum())  # log of the total mass
    return (np.exp(lses - lse)[:, None] * outs).sum(axis=0)      # [D] mass-weighted sum
