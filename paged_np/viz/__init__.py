"""Drawings of the cache, the engine and the kernels (matplotlib, imported lazily).

:mod:`.arena` draws the arena, block tables, the LRU list and a timeline replayed
from the cache's events; :mod:`.anim` animates those events; :mod:`.engine` draws
an engine run over time; :mod:`.kernels` draws one query's online softmax, the
roofline and the page sweep; :mod:`.layouts` draws a K page in both layouts.
"""

from .anim import animate_events, animation_html, event_slider
from .arena import (
    STATE_COLORS,
    add_state_legend,
    draw_arena,
    draw_block_tables,
    draw_frame,
    draw_lru,
    draw_timeline,
    owner_color,
    page_owners,
    replay_events,
    state_counts,
    step_series,
)
from .engine import draw_engine_run
from .kernels import draw_online_softmax, draw_page_sweep, draw_roofline, online_softmax_trace
from .layouts import draw_k_layouts, k_page_cells, vector_load

__all__ = [
    "STATE_COLORS", "add_state_legend", "animate_events", "animation_html",
    "draw_arena", "draw_block_tables", "draw_engine_run", "draw_frame", "draw_k_layouts",
    "draw_lru", "draw_online_softmax", "draw_page_sweep", "draw_roofline", "draw_timeline",
    "event_slider", "k_page_cells", "online_softmax_trace", "owner_color", "page_owners",
    "replay_events", "state_counts", "step_series", "vector_load",
]
