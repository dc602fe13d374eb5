"""Drawings of the radix tree (``CacheConfig(prefix_cache="radix")``) from the cache's state.

- :func:`draw_radix_tree`: one picture of the tree as it is now. Each node is
  a box with the start of its token run, its pages and its ``lock_ref``;
  locked nodes (a live sequence's path) are blue, unlocked ones (CACHED,
  evictable) gold, and the leaf that eviction takes next is outlined in red.
- :func:`radix_story`: a scripted run on a small cache, drawn after each step:
  a prompt, a second prompt that splits the first one's edge, a fork, the
  first sequences finishing, and a long prompt that evicts leaves first.

``python docs/img/make_radix_figure.py`` saves the story as the docs' PNG.
Matplotlib is imported only when a function is called.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from .arena import STATE_COLORS, pyplot


def _index_of(cache_or_index):
    """The prefix index of a cache (or the index itself), and its tree (PrefixIndex.walk)."""
    from ..cache.prefix_index import PrefixIndex

    index = getattr(cache_or_index, "prefix_index", cache_or_index)
    nodes = index.walk() if isinstance(index, PrefixIndex) else None
    if nodes is None:
        raise InvalidArgument(
            "draw_radix_tree needs a PagedKVCache with prefix_cache='radix' or a RadixIndex")
    return index, nodes


def _label(node, max_tokens: int) -> str:
    toks = " ".join(str(t) for t in node.tokens[:max_tokens])
    if len(node.tokens) > max_tokens:
        toks += f" …(+{len(node.tokens) - max_tokens})"
    pages = node.pages
    pg = (",".join(map(str, pages)) if len(pages) <= 4
          else f"{pages[0]},{pages[1]},…,{pages[-1]} ({len(pages)})")
    return f"[{toks}]\npages {pg}\nlock_ref {node.lock_ref}"


def _layout(nodes) -> dict:
    """node id -> (x, depth), the root's id None: leaves at consecutive x, a parent over
    its children's middle. ``nodes``: :class:`IndexNode` records, parents first."""
    kids: dict = {}
    for n in nodes:
        kids.setdefault(n.parent, []).append(n.id)
    pos: dict = {}
    next_x = [0.0]

    def place(node_id, depth):
        below = sorted(kids.get(node_id, ()))
        if not below:
            pos[node_id] = (next_x[0], depth)
            next_x[0] += 1.0
            return
        for c in below:
            place(c, depth + 1)
        xs = [pos[c][0] for c in below]
        pos[node_id] = ((min(xs) + max(xs)) / 2, depth)

    place(None, 0)
    return pos


def draw_radix_tree(cache, ax=None, title: str | None = None, max_tokens: int = 4):
    """Draw the tree of ``cache`` (a radix PagedKVCache, or a RadixIndex); returns the Figure.

    It reads the index through its public methods only: :meth:`PrefixIndex.walk`
    (the nodes) and :meth:`PrefixIndex.eviction_order` (the next victim).
    """
    plt = pyplot()
    index, nodes = _index_of(cache)
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
    else:
        fig = ax.figure
    pos = _layout(nodes)
    order = index.eviction_order()
    victim = next((n.id for n in nodes if order and order[0] in n.pages), None)
    x, y = pos[None]
    ax.plot([x], [-y], "o", color="black", ms=5, zorder=3)
    ax.annotate("root", (x, -y), xytext=(0, 7), textcoords="offset points",
                ha="center", fontsize=7)
    for node in nodes:
        x, y = pos[node.id]
        px, py = pos[node.parent]
        ax.plot([px, x], [-py, -y], color="#888888", lw=1, zorder=1)
        color = STATE_COLORS["in_use"] if node.lock_ref else STATE_COLORS["cached"]
        is_victim = node.id == victim
        edge = "#d62728" if is_victim else "#333333"
        ax.text(x, -y, _label(node, max_tokens), ha="center", va="center", fontsize=6.5,
                color="white" if node.lock_ref else "black", zorder=2,
                bbox=dict(boxstyle="round,pad=0.3", fc=color, ec=edge,
                          lw=2 if is_victim else 0.8))
    xs = [p[0] for p in pos.values()] or [0]
    ys = [-p[1] for p in pos.values()] or [0]
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.4)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=8)
    return fig


def radix_story(page_size: int = 2, num_pages: int = 14):
    """A small scripted run, the tree drawn after each step; returns the Figure.

    Steps: ``a`` runs a system prompt + question 1; ``b`` the same system
    prompt + question 2 (the edge splits where they part); ``a`` forks ``a2``,
    which then writes its own page; ``a``, ``a2`` and ``b`` finish (every node
    unlocked, CACHED); ``d``, a long unrelated prompt, needs more pages than are
    free, so leaves are evicted, least recently used first, and the shared
    system prompt, used last, survives.
    """
    import numpy as np

    from ..cache.kv_cache import PagedKVCache
    from ..config import CacheConfig

    plt = pyplot()
    cache = PagedKVCache(CacheConfig(num_pages=num_pages, page_size=page_size, num_layers=1,
                                     num_kv_heads=1, head_dim=2, prefix_cache="radix"))

    def run(sid, tokens):
        hit = cache.add_sequence(sid, tokens)
        slots = cache.allocate_slots(sid, len(tokens) - hit)
        kv = np.zeros((len(slots), 1, 2), np.float32)
        cache.write_kv(0, slots, kv, kv)
        cache.append_tokens(sid, tokens[hit:])
        return hit

    system = [7, 7, 8, 8, 9, 9]
    fig, axes = plt.subplots(1, 5, figsize=(17, 3.6))

    def panel(i, title):
        cache.check_invariants()
        draw_radix_tree(cache, ax=axes[i], title=f"{i + 1}. {title}")

    run("a", system + [1, 2, 3, 4, 5])
    panel(0, "a: system prompt + question 1")
    hit = run("b", system + [6, 6, 5, 5, 5])
    panel(1, f"b: same system prompt, reuses {hit} tokens;\nthe edge splits where they part")
    cache.fork("a", "a2")
    cache.allocate_slots("a2", page_size)
    cache.append_tokens("a2", [0] * page_size)
    panel(2, "a forks a2, which writes a page of its own")
    for sid in ("b", "a", "a2"):                 # b finishes first: its leaf is the oldest
        cache.free(sid)
    panel(3, "b, then a and a2 finish: nothing locked,\nall CACHED (red: next victim)")
    before = cache.stats()["evictions"]
    run("d", [3] * (page_size * (num_pages - 5)))
    panel(4, f"d, a long new prompt: {cache.stats()['evictions'] - before} pages evicted,\n"
             "least recently used leaves first")
    fig.tight_layout()
    return fig
