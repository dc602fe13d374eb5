"""Solutions to notebook 7's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 7
rows_per_seq = 1 * (32 // 8)                  # one query x 4 query heads of a group
num_work = 5 * -(-rows_per_seq // nc.K.ROWS)  # ceil, per sequence: one tile each
blocks = num_work * 8 * 4                     # x kv heads x splits
