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
