"""Solutions to notebook 8's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 8a
arena_pages = 64 * 2**20 // per_page          # whole pages only: round down
chats = arena_pages // -(-1000 // 16)         # each chat takes ceil(1000 / 16) = 63 pages
