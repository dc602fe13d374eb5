"""Drawings of the cache with matplotlib. Every function returns a Figure.

Library code never calls ``plt.show()``: a notebook shows the returned figure,
a script saves it (``fig.savefig(path)``).
"""

from __future__ import annotations

#: Colours of the page states; owners of IN_USE pages get the tab10 colours.
STATE_COLORS = {"free": "#e6e6e6", "cached": "#f2c14e", "in_use": "#4c72b0"}


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        try:
            import IPython  # noqa: F401  (in Jupyter: keep its inline backend)
        except ImportError:
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def owner_color(seq_id):
    """A colour per sequence id, the same in every drawing (tab10, chosen by crc32)."""
    import zlib

    palette = _pyplot().get_cmap("tab10").colors
    return palette[zlib.crc32(str(seq_id).encode()) % 10]


def page_owners(cache) -> dict[int, list]:
    """page id -> the sequence ids whose block tables hold it."""
    owners: dict[int, list] = {}
    for sid in cache.seq_ids:
        for p in cache.sequence(sid).block_table:
            owners.setdefault(p, []).append(sid)
    return owners


def draw_arena(cache, ax=None, title: str | None = None, cols: int | None = None):
    """The arena as a grid of pages, coloured by state and owner.

    FREE pages are grey, CACHED pages gold, IN_USE pages take their (first)
    owner's colour and are labelled with the owner; a page shared by several
    block tables shows its ref count (``x2``).
    """
    plt = _pyplot()
    n = cache.cfg.num_pages
    cols = cols or min(n, 16)
    rows = -(-n // cols)
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(4, cols * 0.7), max(1.2, rows * 0.75 + 0.5)))
    else:
        fig = ax.figure
    owners = page_owners(cache)
    seq_color = {sid: owner_color(sid) for sid in cache.seq_ids}
    for p in range(n):
        r, c = divmod(p, cols)
        state = cache.pool.state(p)
        color = seq_color[owners[p][0]] if state == "in_use" else STATE_COLORS[state]
        ax.add_patch(plt.Rectangle((c, -r), 0.92, 0.92, facecolor=color, edgecolor="black",
                                   linewidth=0.6))
        label = str(p)
        if state == "in_use":
            label += "\n" + ",".join(str(s) for s in owners[p])[:10]
        elif state == "cached":
            label += "\ncached"
        ax.text(c + 0.46, -r + 0.46, label, ha="center", va="center", fontsize=7)
        refs = cache.pool.ref_count(p)
        if refs > 1:
            ax.text(c + 0.88, -r + 0.86, f"x{refs}", ha="right", va="top", fontsize=7,
                    fontweight="bold", color="white")
    ax.set_xlim(-0.1, cols)
    ax.set_ylim(-rows + 0.9, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9, loc="left")
    return fig


def add_state_legend(fig) -> None:
    """A legend of the page states along the bottom of ``fig``."""
    plt = _pyplot()
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", linewidth=0.5)
               for c in STATE_COLORS.values()]
    fig.legend(handles, ["free", "cached (ref 0, hashed)", "in use (coloured by owner)"],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
