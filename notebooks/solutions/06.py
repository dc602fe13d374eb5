"""Solutions to notebook 6's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 6
# intensity = (H / Hkv) / (2 * bytes per value): each key byte serves H / Hkv query heads
intensity_fp16 = bench.H / (2 * bench.HKV) * 4 / 2      # half the bytes per value: x2
intensity_mqa = 32 / (2 * 1)                             # one kv head for 32 query heads
