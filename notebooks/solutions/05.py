"""Solutions to notebook 5's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 5
# After step 1, A holds 2 pages, B 1, C 2: one is free. B's token at position 4 (step 3)
# takes it. A's at position 8 (step 4) finds none, and the scheduler preempts the newest
# running request, which is not A.
victim = "C"
at_step = 4
