"""Solutions to notebook 3's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 3
# After touch(order[0]) the line is order[1:] + [order[0]]. The hit on systems[1] takes
# its pages (order[3:6]) out of the line, which leaves order[1] at the old end.
next_victim = order[1]
