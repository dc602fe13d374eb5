"""Solutions to notebook 12's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 12a
break_even_gbs = bytes_per_token / prefill_s_per_token / 1e9     # bytes/s at equal cost
disk_speedup = prefill_s_per_token / (bytes_per_token / (disk_gbs * 1e9))
