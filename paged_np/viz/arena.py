"""Drawings of the cache with matplotlib. Every function returns a Figure.

What each one shows (all take a :class:`~paged_np.PagedKVCache` or its
``events`` log; colours: FREE grey, CACHED gold, IN_USE the owner's colour):

- :func:`draw_arena`: every page of the arena as a square, labelled with its
  owners; a shared page shows its ref count (``x2``).
- :func:`draw_block_tables`: each sequence's logical pages with an arrow to
  the page id that holds them; shared pages receive several arrows.
- :func:`draw_lru`: the CACHED pages in eviction order, next victim first.
- :func:`replay_events`, :func:`state_counts`, :func:`draw_frame`,
  :func:`draw_timeline`: the arena rebuilt from ``cache.events``, step by step,
  and the pages by state over time (with requests running / waiting and
  preemptions from per-step engine metrics).

Elsewhere: :mod:`paged_np.viz.anim` (an animation and a slider over the
events), :mod:`paged_np.viz.kernels` (one query's online softmax, the roofline).

Library code never calls ``plt.show()``: a notebook shows the returned figure,
a script saves it (``fig.savefig(path)``).
"""

from __future__ import annotations

from ..errors import InvalidArgument

#: Colours of the page states; owners of IN_USE pages get the tab10 colours.
STATE_COLORS = {"free": "#e6e6e6", "cached": "#f2c14e", "in_use": "#4c72b0"}


def pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        try:
            import IPython  # noqa: F401  (in Jupyter: keep its inline backend)
        except ImportError:
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_OWNER_INDEX: dict = {}  # str(seq_id) -> palette index, in order of first drawing


def owner_color(seq_id):
    """A colour per sequence id, the same in every drawing of this process.

    Ids get the tab10 colours in the order they are first drawn, so the few
    sequences of a notebook cell all get different colours (the 11th id
    reuses the first colour).
    """
    palette = pyplot().get_cmap("tab10").colors
    idx = _OWNER_INDEX.setdefault(str(seq_id), len(_OWNER_INDEX))
    return palette[idx % len(palette)]


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
    plt = pyplot()
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
    plt = pyplot()
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", linewidth=0.5)
               for c in STATE_COLORS.values()]
    fig.legend(handles, ["free", "cached (ref 0, hashed)", "in use (coloured by owner)"],
               loc="lower center", ncol=3, fontsize=8, frameon=False)


# ---------------------------------------------------------------------------
# Block tables: logical pages -> physical pages
# ---------------------------------------------------------------------------
def draw_block_tables(cache, seq_ids=None, ax=None, title: str | None = None,
                      cols: int | None = None):
    """Each sequence's block table as arrows from its logical pages to page ids.

    Top row: every sequence's logical pages ``L0, L1, ...`` side by side (the
    shading shows how many of the page's slots hold tokens). Bottom: the
    arena's pages, coloured as in :func:`draw_arena`. One arrow per logical
    page, so a page shared by several block tables (a prefix hit, a fork)
    receives several arrows and shows its ref count (``x2``).
    """
    plt = pyplot()
    from matplotlib.patches import FancyArrowPatch

    seq_ids = list(cache.seq_ids if seq_ids is None else seq_ids)
    n = cache.cfg.num_pages
    ps = cache.page_size
    lengths = [len(cache.sequence(s).block_table) for s in seq_ids]
    top_width = sum(lengths) + 0.6 * max(0, len(seq_ids) - 1)
    cols = cols or max(min(n, 16), min(n, int(top_width + 0.99)))
    phys_rows = -(-n // cols)
    width = max(cols, top_width)
    drop = 2.4  # vertical room for the arrows between the two rows
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5, width * 0.6 + 1), 1.6 + 0.6 * (drop + phys_rows)))
    else:
        fig = ax.figure

    def phys_xy(p):  # lower-left corner of page p in a cols-wide grid below
        r, c = divmod(p, cols)
        return c, -(drop + 1 + 1.3 * r)

    owners = page_owners(cache)
    for sid in seq_ids:
        owner_color(sid)  # give colours in the order of the sequences
    for p in range(n):
        x, y = phys_xy(p)
        state = cache.pool.state(p)
        color = owner_color(owners[p][0]) if state == "in_use" else STATE_COLORS[state]
        ax.add_patch(plt.Rectangle((x, y), 0.9, 0.9, facecolor=color, edgecolor="black",
                                   linewidth=0.6, zorder=2))
        ax.text(x + 0.45, y + 0.45, str(p), ha="center", va="center", fontsize=7, zorder=3)
        if cache.pool.ref_count(p) > 1:
            ax.text(x + 0.45, y - 0.08, f"x{cache.pool.ref_count(p)}", ha="center",
                    va="top", fontsize=7, fontweight="bold")

    x = 0.0
    for sid in seq_ids:
        seq = cache.sequence(sid)
        color = owner_color(sid)
        ax.text(x, 1.05, f"{sid}", ha="left", va="bottom", fontsize=8, color=color,
                fontweight="bold")
        for i, p in enumerate(seq.block_table):
            filled = min(ps, max(0, seq.seq_len - i * ps)) / ps  # share of slots written
            ax.add_patch(plt.Rectangle((x, 0), 0.9, 0.9, facecolor="white", edgecolor=color,
                                       linewidth=1.2, zorder=2))
            ax.add_patch(plt.Rectangle((x, 0), 0.9 * filled, 0.9, facecolor=color, alpha=0.35,
                                       linewidth=0, zorder=2))
            ax.text(x + 0.45, 0.45, f"L{i}", ha="center", va="center", fontsize=7, zorder=3)
            px, py = phys_xy(int(p))
            ax.add_patch(FancyArrowPatch((x + 0.45, 0), (px + 0.45, py + 0.9),
                                         arrowstyle="-|>", mutation_scale=7, linewidth=0.9,
                                         color=color, alpha=0.85, zorder=1))
            x += 1
        x += 0.6
    ax.text(-0.2, 0.45, "logical", ha="right", va="center", fontsize=8)
    ax.text(-0.2, phys_xy(0)[1] + 0.45, "page id", ha="right", va="center", fontsize=8)
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(phys_xy(n - 1)[1] - 0.5, 1.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"block tables (page_size={ps}): logical page -> page id",
                 fontsize=9, loc="left")
    return fig


# ---------------------------------------------------------------------------
# The eviction order
# ---------------------------------------------------------------------------
def draw_lru(cache, ax=None, title: str | None = None):
    """The CACHED pages in eviction order: the next victim on the left.

    Under LRU the right end holds the page released (or touched) most
    recently; a prefix hit takes a page out of the line, ``free`` appends.
    """
    plt = pyplot()
    order = cache.pool.eviction_order()
    k = max(1, len(order))
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(4, 0.75 * k + 2.2), 1.6))
    else:
        fig = ax.figure
    for i, p in enumerate(order):
        ax.add_patch(plt.Rectangle((i, 0), 0.9, 0.9, facecolor=STATE_COLORS["cached"],
                                   edgecolor="black", linewidth=0.6))
        ax.text(i + 0.45, 0.45, str(p), ha="center", va="center", fontsize=8)
    if order:
        ax.annotate("next victim", (0.45, 0.0), (0.45, -0.55), ha="center", fontsize=7,
                    arrowprops=dict(arrowstyle="->", linewidth=0.8))
        ax.text(len(order) - 0.1, -0.4, "released last", ha="right", fontsize=7)
    else:
        ax.text(0, 0.45, "no cached page", va="center", fontsize=8, style="italic")
    ax.set_xlim(-0.2, k + 0.2)
    ax.set_ylim(-0.8, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"eviction order ({cache.pool.eviction_policy}), "
                 f"{len(order)} cached pages", fontsize=9, loc="left")
    return fig


# ---------------------------------------------------------------------------
# Replaying cache.events: page states over time
# ---------------------------------------------------------------------------
#: The page state after an event of each kind (kinds not listed leave it alone).
_STATE_AFTER = {"allocate": "in_use", "hit": "in_use", "cache": "cached", "free": "free",
                "evict": "free"}


def replay_events(events, num_pages: int, by: str = "step"):
    """Rebuild page states from an event log, one frame per step (or per event).

    Returns a list of ``(label, states, owners)``: ``states`` a list of
    ``"free" | "cached" | "in_use"`` per page, ``owners`` per page the sequence
    ids that took it (an allocation, a prefix hit, a fork) since it was last
    released. States are exact. Owners are a sketch: the pool logs only a
    page's *last* release, so a sequence that drops a still-shared page (a
    copy-on-write, a finished sharer) stays listed until the page is released.
    ``by="step"`` groups events by ``Event.step`` (``cache.tick()``);
    ``by="event"`` makes a frame of every event.
    """
    if by not in ("step", "event"):
        raise InvalidArgument(f"by must be 'step' or 'event', got {by!r}")
    states = ["free"] * num_pages
    owners: list[list] = [[] for _ in range(num_pages)]
    frames = []
    for i, ev in enumerate(events):
        kind, p, sid = ev.kind, ev.page_id, ev.seq_id
        if not 0 <= p < num_pages:
            raise InvalidArgument(f"events[{i}].page_id={p} is outside [0, {num_pages})")
        states[p] = _STATE_AFTER.get(kind, states[p])
        if kind in ("allocate", "hit", "fork") and sid not in owners[p]:
            owners[p].append(sid)
        elif kind in ("cache", "free", "evict"):
            owners[p] = []
        last = i + 1 == len(events) or (by == "event" or events[i + 1].step != ev.step)
        if last:
            label = (f"event {i}: {kind} page {p}" + (f" ({sid})" if sid is not None else "")
                     if by == "event" else f"step {ev.step}")
            frames.append((label, list(states), [list(o) for o in owners]))
    return frames


def draw_frame(frame, ax=None, cols: int = 16):
    """One frame of :func:`replay_events` as an arena grid (like :func:`draw_arena`)."""
    plt = pyplot()
    label, states, owners = frame
    n = len(states)
    cols = min(n, cols)
    rows = -(-n // cols)
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(4, cols * 0.7), max(1.2, rows * 0.75 + 0.5)))
    else:
        fig = ax.figure
    for p in range(n):
        r, c = divmod(p, cols)
        color = owner_color(owners[p][0]) if states[p] == "in_use" and owners[p] else \
            STATE_COLORS[states[p]]
        ax.add_patch(plt.Rectangle((c, -r), 0.92, 0.92, facecolor=color, edgecolor="black",
                                   linewidth=0.6))
        extra = ",".join(map(str, owners[p]))[:10] if states[p] == "in_use" else \
            ("cached" if states[p] == "cached" else "")
        ax.text(c + 0.46, -r + 0.46, f"{p}\n{extra}".strip(), ha="center", va="center",
                fontsize=7)
    ax.set_xlim(-0.1, cols)
    ax.set_ylim(-rows + 0.9, 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(label, fontsize=9, loc="left")
    return fig


def state_counts(events, num_pages: int) -> dict:
    """Per step: pages FREE / CACHED / IN_USE and evictions, from an event log.

    Returns a dict of int arrays ``step, free, cached, in_use, evictions``, one
    entry per step from 0 to the last event's step (a step without events
    repeats the previous counts).
    """
    import numpy as np

    last_step = max((ev.step for ev in events), default=0)
    steps = np.arange(last_step + 1)
    out = {k: np.zeros(last_step + 1, dtype=np.int64) for k in ("free", "cached", "in_use",
                                                                 "evictions")}
    out["step"] = steps
    frames = {int(lbl.split()[1]): st for lbl, st, _ in replay_events(events, num_pages)}
    current = ["free"] * num_pages
    for s in steps:
        current = frames.get(int(s), current)
        for k in ("free", "cached", "in_use"):
            out[k][s] = current.count(k)
    for ev in events:
        if ev.kind == "evict":
            out["evictions"][ev.step] += 1
    return out


def step_series(steps) -> dict:
    """Per-step request counts from engine metrics, as int arrays ``running``,
    ``waiting``, ``preemptions`` (preemptions *at* each step; absent keys are 0).

    ``steps`` is either ``engine.metrics`` (or its ``"series"`` dict: lists keyed
    ``running``, ``waiting`` and ``preemptions``, the last a running total), or
    a list of per-step dicts with ``num_running``, ``num_waiting`` and
    ``preemptions`` (the count at that step).
    """
    import numpy as np

    if isinstance(steps, dict):
        ser = steps.get("series", steps)
        n = max((len(v) for v in ser.values() if isinstance(v, list)), default=0)

        def get(k):
            return np.asarray(ser[k], dtype=np.int64) if k in ser else np.zeros(n, np.int64)

        total = get("preemptions")                                     # running total
        return {"running": get("running"), "waiting": get("waiting"),
                "preemptions": np.diff(total, prepend=0)}
    rows = list(steps)

    def col(k):
        return np.array([int(d.get(k, 0)) for d in rows], dtype=np.int64)

    return {"running": col("num_running"), "waiting": col("num_waiting"),
            "preemptions": col("preemptions")}


def draw_timeline(events, num_pages: int, steps=None, ax=None, title: str | None = None):
    """Pages by state over time, evictions marked; running/waiting requests below.

    ``events`` is ``cache.events`` (``engine.cache.events`` for an engine).
    ``steps`` is optional: engine metrics or per-step dicts (see
    :func:`step_series`), drawn in a second panel: running and waiting
    requests, preemptions as red lines.
    """
    plt = pyplot()
    c = state_counts(events, num_pages)
    series = step_series(steps) if steps is not None else None
    if ax is None:
        n_panels = 2 if series is not None else 1
        fig, axes = plt.subplots(n_panels, 1, figsize=(8, 2.4 * n_panels + 0.4), sharex=True,
                                 squeeze=False)
        ax, ax2 = axes[0, 0], (axes[1, 0] if series is not None else None)
    else:
        fig, ax2 = ax.figure, None
    x = c["step"]
    ax.stackplot(x, c["in_use"], c["cached"], c["free"], step="post",
                 colors=[STATE_COLORS["in_use"], STATE_COLORS["cached"], STATE_COLORS["free"]],
                 labels=["in use", "cached", "free"])
    ev_steps = x[c["evictions"] > 0]
    if len(ev_steps):
        ax.scatter(ev_steps + 0.5, [num_pages * 1.04] * len(ev_steps),
                   s=12 + 6 * c["evictions"][c["evictions"] > 0], marker="v", color="black",
                   label="evictions", clip_on=False, zorder=3)
    ax.set_ylim(0, num_pages)
    ax.set_ylabel("pages")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    ax.set_title(title or "pages by state", fontsize=9, loc="left", pad=12)
    if ax2 is not None:
        xs = range(len(series["running"]))
        for key, color in (("running", "tab:green"), ("waiting", "tab:orange")):
            if series[key].any():
                ax2.step(xs, series[key], where="post", color=color, label=key)
        pre = [i for i, k in enumerate(series["preemptions"]) if k]
        for i in pre:
            ax2.axvline(i, color="tab:red", linewidth=0.8, alpha=0.7)
        if pre:
            ax2.plot([], [], color="tab:red", label="preemption")
        ax2.set_ylabel("requests")
        ax2.set_xlabel("step")
        ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    else:
        ax.set_xlabel("step")
    fig.tight_layout()
    return fig
