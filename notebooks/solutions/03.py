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
