"""Solutions to notebook 9's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 9a
d = block[0:2].view(np.float16)[0].astype(np.float32)          # the scale
m = block[2:4].view(np.float16)[0].astype(np.float32)          # the minimum
nibbles = block[4:20]
q = np.concatenate([nibbles & 0x0F, nibbles >> 4])             # q[0..15], then q[16..31]
weights = (d * q.astype(np.float32) + m).astype(np.float32)
