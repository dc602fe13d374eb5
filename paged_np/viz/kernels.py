"""Drawings of the kernels: one query's online softmax, the roofline and the page sweep.

:func:`online_softmax_trace` runs the online softmax of one query over a
sequence's keys *page by page* in plain NumPy and keeps the running state
after every page; :func:`draw_online_softmax` draws it. The state per page is
the one every paged kernel keeps (see :mod:`paged_np.attention.numpy_paged`)::

    m     running max of the scores seen so far
    l     running sum of exp(score - m)
    alpha exp(m_old - m_new): the factor that rescales the old sum when the max grows
"""

from __future__ import annotations

import numpy as np

from ..checks import check_positive_int
from ..errors import InvalidArgument, ShapeError
from .arena import pyplot
from .layouts import K_LAYOUTS


def online_softmax_trace(q, k, page_size: int, scale: float | None = None) -> dict:
    """One query's online softmax over keys ``k``, one page of ``page_size`` keys at a time.

    q ``[head_dim]``, k ``[n, head_dim]`` (the sequence's keys in token order).
    Returns a dict of float64 arrays: ``scores [n]``; per page ``page_max``,
    ``m``, ``l``, ``alpha`` ``[num_pages]`` (state *after* the page); and the
    final ``weights [n]``, equal to ``softmax(scores)``, and ``lse`` (a float).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.ndim != 1 or k.ndim != 2 or k.shape[1] != q.shape[0] or k.shape[0] == 0:
        raise ShapeError(f"q must be [head_dim] and k [n>0, head_dim], got {q.shape}, {k.shape}")
    page_size = check_positive_int("page_size", page_size)
    scale = 1.0 / np.sqrt(q.shape[0]) if scale is None else float(scale)
    scores = k @ q * scale                                  # [n]
    n_pages = -(-len(scores) // page_size)
    m_run, l_run = -np.inf, 0.0
    out = {key: np.empty(n_pages) for key in ("page_max", "m", "l", "alpha")}
    for i in range(n_pages):
        s = scores[i * page_size:(i + 1) * page_size]      # [<= page_size] this page
        m_new = max(m_run, s.max())
        alpha = np.exp(m_run - m_new)                       # 0 on the first page
        l_run = alpha * l_run + np.exp(s - m_new).sum()
        m_run = m_new
        out["page_max"][i], out["m"][i], out["l"][i], out["alpha"][i] = s.max(), m_run, l_run, alpha
    out["scores"] = scores
    out["weights"] = np.exp(scores - m_run) / l_run         # [n]
    out["lse"] = float(m_run + np.log(l_run))
    return out


def draw_online_softmax(q, k, page_size: int, scale: float | None = None):
    """Three panels: scores by page with the running max; the running sum with the
    rescaling factor ``alpha`` at each page; the final weights beside the dense softmax.
    """
    plt = pyplot()
    t = online_softmax_trace(q, k, page_size, scale)
    n, n_pages = len(t["scores"]), len(t["m"])
    pos = np.arange(n)
    page_of = pos // page_size
    colors = np.where(page_of % 2 == 0, "#4c72b0", "#8fb3de")
    edges = np.minimum(np.arange(n_pages + 1) * page_size, n) - 0.5  # page boundaries
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(8, 6.2), sharex=True)

    a1.bar(pos, t["scores"], color=colors, width=0.85)
    a1.stairs(t["m"], edges, baseline=None, color="tab:red", linewidth=1.8,
              label="running max m")
    a1.set_ylabel("score q.k")
    a1.legend(fontsize=7, loc="lower right")
    a1.set_title(f"one query over {n} keys in {n_pages} pages of {page_size}", fontsize=9,
                 loc="left")

    a2.stairs(t["l"], edges, baseline=None, color="tab:green", linewidth=1.8,
              label="running sum l = sum exp(s - m)")
    for i in range(1, n_pages):
        if t["alpha"][i] < 0.999:  # the max grew on page i: the old sum was rescaled
            a2.annotate(f" old l x {t['alpha'][i]:.2f}", (edges[i], t["l"][i - 1]), fontsize=7,
                        color="tab:red", ha="left", va="top")
    a2.set_ylabel("l")
    a2.set_ylim(0, 1.15 * t["l"].max())
    a2.legend(fontsize=7, loc="lower right")

    dense = np.exp(t["scores"] - t["scores"].max())
    dense /= dense.sum()                                    # [n] softmax in one go
    a3.bar(pos, t["weights"], color=colors, width=0.85, label="online: exp(s - m) / l")
    a3.plot(pos, dense, "k.", markersize=4, label="dense softmax")
    a3.set_ylabel("weight")
    a3.set_xlabel("token position")
    a3.legend(fontsize=7, loc="upper left")
    for a in (a1, a2, a3):
        for e in edges[1:-1]:
            a.axvline(e, color="grey", linewidth=0.5, linestyle=":")
    fig.tight_layout()
    return fig


def draw_roofline(points, peak_bandwidth: float, peak_flops: float | None = None, ax=None,
                  title: str | None = None):
    """The roofline: achieved FLOP/s against arithmetic intensity, on log-log axes.

    ``points`` is a list of dicts with ``label``, ``flops``, ``bytes`` (moved
    to or from memory per call) and ``seconds`` (per call). Each becomes a dot
    at intensity ``flops / bytes`` and speed ``flops / seconds``; optional
    ``marker`` and ``color`` (matplotlib's) pair dots up, e.g. one case in two
    K layouts: one colour, a circle and a square.
    ``peak_bandwidth`` (bytes/s) draws the slanted memory roof, ``peak_flops``
    (FLOP/s, optional) the flat compute roof. A kernel under the slanted roof
    is memory-bound: its best possible speed is ``intensity * bandwidth``, and
    the dot's height shows how much of that bandwidth it reaches. Decode
    attention reads every K/V byte once for about 1 FLOP per byte (fp32), so
    it always sits far left, under the memory roof.
    """
    plt = pyplot()
    if not points:
        raise InvalidArgument("points is empty: there is nothing to draw")
    if not peak_bandwidth > 0:
        raise InvalidArgument(f"peak_bandwidth must be > 0, got {peak_bandwidth!r}")
    for i, pt in enumerate(points):
        for key in ("label", "flops", "bytes", "seconds"):
            if key not in pt:
                raise InvalidArgument(f"points[{i}] has no {key!r}")
        if not (pt["flops"] > 0 and pt["bytes"] > 0 and pt["seconds"] > 0):
            raise InvalidArgument(f"points[{i}]: flops, bytes and seconds must be > 0")
    legend_outside = ax is None and len(points) > 6   # a long legend would hide the dots
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 4) if legend_outside else (6.5, 4))
    else:
        fig = ax.figure
    intensity = np.array([p["flops"] / p["bytes"] for p in points])   # [n] FLOP/byte
    speed = np.array([p["flops"] / p["seconds"] for p in points])     # [n] FLOP/s
    lo, hi = intensity.min() / 4, intensity.max() * 4
    if peak_flops:
        hi = max(hi, 4 * peak_flops / peak_bandwidth)
    x = np.geomspace(lo, hi, 200)                                     # [200]
    roof = x * peak_bandwidth if not peak_flops else np.minimum(x * peak_bandwidth, peak_flops)
    ax.loglog(x, roof, color="black", linewidth=1.5, label="roofline")
    for i, p in enumerate(points):
        ax.loglog(intensity[i], speed[i], p.get("marker", "o"), markersize=7, label=p["label"],
                  color=p.get("color"))
        frac = speed[i] / min(intensity[i] * peak_bandwidth, peak_flops or np.inf)
        left = p.get("marker", "o") != "o"          # a paired dot: its number on the left
        ax.annotate(f"{frac:.0%}", (intensity[i], speed[i]), textcoords="offset points",
                    xytext=(-6, -10) if left else (6, -10), ha="right" if left else "left",
                    fontsize=7)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP / s")
    if legend_outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    ax.set_title(title or f"roofline: memory roof {peak_bandwidth / 1e9:.1f} GB/s"
                 + (f", compute roof {peak_flops / 1e9:.0f} GFLOP/s" if peak_flops else ""),
                 fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def draw_page_sweep(rows, ax=None, title: str = "decode across page sizes"):
    """Decode speed (GB/s of K/V) against page size, one bar per K layout.

    ``rows``: the bench's ``page_sweep`` rows, ``{"page_size", "gbs_hnd",
    "gbs_k_transposed"}``; a layout's bar is left out where its key is. Rows
    written before the layouts existed hold one ``gbs``, which is hnd's.
    """
    plt = pyplot()
    if not rows:
        raise InvalidArgument("rows is empty: there is nothing to draw")
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 2.8))
    else:
        fig = ax.figure
    gbs = {layout: [r.get(f"gbs_{layout}", r.get("gbs") if layout == "hnd" else None)
                    for r in rows] for layout in K_LAYOUTS}         # {layout: [n] GB/s or None}
    shown = [layout for layout in K_LAYOUTS if any(g is not None for g in gbs[layout])]
    if not shown:
        raise InvalidArgument("no row holds gbs, gbs_hnd or gbs_k_transposed")
    x, width = np.arange(len(rows)), 0.8 / len(shown)
    for i, layout in enumerate(shown):
        ys = [np.nan if g is None else g for g in gbs[layout]]
        ax.bar(x + (i - (len(shown) - 1) / 2) * width, ys, width, label=K_LAYOUTS[layout],
               color=("#4c72b0", "#dd8452")[i])
    ax.set_xticks(x, [str(r["page_size"]) for r in rows])
    ax.set_xlabel("page size (tokens)")
    ax.set_ylabel("GB/s of K/V")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    fig.tight_layout()
    return fig
