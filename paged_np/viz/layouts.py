"""The two layouts of a K page, and the floats one vector load reads in each.

One kv head's K page holds ``page_size`` keys of ``head_dim`` floats. The arena
can lay it out two ways (``kv_layout``)::

    "hnd"           [page_size, head_dim]   row t: key t's dimensions, side by side
    "k_transposed"  [head_dim, page_size]   row d: dimension d of every key, side by side

A CPU reads memory into vector registers 64 bytes at a time (one 512-bit load,
16 float32 *lanes*), always from consecutive addresses. So the layout decides
what one load holds, and what the kernel can do with it:

- hnd: 16 dimensions of ONE key. ``q . k`` multiplies them lane by lane into 16
  partial sums of one score, which must be added across the lanes at the end
  (:func:`~paged_np.attention.numba_kernels.tile_scores_4x4`);
- k_transposed: dimension d of 16 consecutive KEYS. ``acc[0:16] += q[d] * load``
  is one multiply-add into each of 16 scores; key t stays in lane t, nothing is
  reduced (:mod:`paged_np.attention.numba_kt`).

:func:`k_page_cells` says which key and dimension each memory cell of a page
holds, :func:`vector_load` which cells one load reads, and
:func:`draw_k_layouts` draws both layouts side by side. Everything is computed
from the layouts (an ``np.indices`` grid, transposed; ``np.arange`` addresses),
not placed by hand. Compared with vLLM: its first key cache was
``[num_blocks, num_kv_heads, head_size / x, block_size, x]``, with ``x`` = 16
bytes of one key per GPU thread; here ``x`` is one element, because on a CPU
the vector runs across keys.

Run ``python -c "from paged_np import viz; viz.draw_k_layouts().savefig('k.png')"``.
"""

from __future__ import annotations

import numpy as np

from ..checks import check_int, check_positive_int
from ..errors import InvalidArgument
from ..registry import KV_LAYOUTS
from .arena import pyplot

#: The K-page layouts, as ``kv_layout`` names them, and how the figures label them.
K_LAYOUTS = {name: entry.label for name, entry in KV_LAYOUTS.items()}
#: float32 lanes of one 512-bit vector load.
LANES = 16


def _check_layout(layout: str) -> str:
    if layout not in K_LAYOUTS:
        raise InvalidArgument(f"layout must be one of {sorted(K_LAYOUTS)}, got {layout!r}")
    return layout


def k_page_cells(page_size: int, head_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Which key and which dimension each memory cell of one K page holds.

    Returns ``(key, dim)``, two int arrays in the page's memory shape (hnd
    ``[page_size, head_dim]``, k_transposed ``[head_dim, page_size]``). Memory is
    row-major: cell ``[r, c]`` is address ``r * cols + c``, and holds element
    ``dim[r, c]`` of key ``key[r, c]``.
    """
    page_size = check_positive_int("page_size", page_size)
    head_dim = check_positive_int("head_dim", head_dim)
    key, dim = np.indices((page_size, head_dim))   # [P, D] each: element (t, d) of the page
    if _check_layout(layout) == "k_transposed":
        key, dim = key.T, dim.T                     # [D, P]: row d holds dim d of every key
    return np.ascontiguousarray(key), np.ascontiguousarray(dim)


def vector_load(page_size: int, head_dim: int, layout: str, load: int = 0,
                lanes: int = LANES) -> dict:
    """The page elements that vector load number ``load`` reads: ``lanes`` consecutive
    addresses, from ``load * lanes`` on.

    Returns ``{"address", "key", "dim"}``, int arrays ``[lanes]`` in lane order, and
    ``"row", "col"``: where those cells sit in the page's memory shape.
    """
    key, dim = k_page_cells(page_size, head_dim, layout)        # [rows, cols]
    lanes = check_positive_int("lanes", lanes)
    if key.size % lanes:
        raise InvalidArgument(f"a page of {key.size} elements is not a whole number of "
                              f"{lanes}-lane loads")
    load = check_int("load", load, 0, key.size // lanes)            # [0, number of loads)
    address = np.arange(key.size).reshape(key.shape)            # [rows, cols] row-major
    hit = (address >= load * lanes) & (address < (load + 1) * lanes)
    row, col = np.nonzero(hit)                                  # [lanes] each, address order
    return {"address": address[row, col], "key": key[row, col], "dim": dim[row, col],
            "row": row, "col": col}


def describe_load(ld: dict) -> str:
    """What a load (from :func:`vector_load`) holds, and what it feeds in ``q . k``."""
    keys, dims = np.unique(ld["key"]), np.unique(ld["dim"])
    if len(keys) == 1:
        return (f"dims {dims[0]}-{dims[-1]} of key {keys[0]}:\n{len(ld['key'])} partial sums "
                f"of ONE score, added across the lanes at the end")
    if len(dims) == 1:
        return (f"dim {dims[0]} of keys {keys[0]}-{keys[-1]}:\none multiply-add q[{dims[0]}] * k "
                f"into each of {len(keys)} scores, nothing reduced")
    return f"parts of keys {keys[0]}-{keys[-1]}, dims {dims[0]}-{dims[-1]}"


def _light(rgba: np.ndarray) -> np.ndarray:
    """Colours mixed with white, so black numbers stay readable on them."""
    return 0.45 * rgba[..., :3] + 0.55


def draw_k_layouts(page_size: int = 16, head_dim: int = 16, load: int = 1,
                   lanes: int = LANES):
    """One K page in both layouts, side by side, as it lies in memory.

    Each panel is the page's memory shape, row-major: the number in a cell is its
    address (memory runs left to right, row after row), its colour the key it
    holds. The cells outlined in red are vector load number ``load`` (``lanes``
    consecutive addresses); each panel's title says what that load holds and
    what it feeds. Returns the Figure.
    """
    plt = pyplot()
    loads = {layout: vector_load(page_size, head_dim, layout, load, lanes) for layout in K_LAYOUTS}
    palette = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.6))
    for ax, layout in zip(axes, K_LAYOUTS):
        key, _ = k_page_cells(page_size, head_dim, layout)      # [rows, cols]
        rows, cols = key.shape
        address = np.arange(key.size).reshape(rows, cols)
        ax.imshow(_light(palette(key % 20)), interpolation="nearest")
        for (r, c), a in np.ndenumerate(address):
            ax.text(c, r, str(a), ha="center", va="center", fontsize=7.5)
        ld = loads[layout]
        for r, c in zip(ld["row"], ld["col"]):
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red",
                                       linewidth=2.2, gid="load"))
        rows_are, cols_are = ("key t", "dim d") if layout == "hnd" else ("dim d", "key t")
        ax.set_ylabel(f"row = {rows_are}")
        ax.set_xlabel(f"column = {cols_are}    (addresses run left to right, row after row)",
                      fontsize=8)
        ax.set_xticks(range(cols))
        ax.set_yticks(range(rows))
        ax.tick_params(labelsize=7)
        shape = "[page_size, head_dim]" if layout == "hnd" else "[head_dim, page_size]"
        ax.set_title(f"{layout}: K page {shape} = [{rows}, {cols}]\n"
                     f"one load = {describe_load(ld)}", fontsize=9, loc="left")
    fig.suptitle(f"one K page ({page_size} keys of {head_dim} float32): colour = key; red = "
                 f"the {lanes} floats of one {lanes * 32}-bit vector load", fontsize=10)
    fig.tight_layout()
    return fig
