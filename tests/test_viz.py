"""Each drawing returns a Figure with the artists its cache state implies.

The states are small and known: a 12-page cache (page_size 4) where A holds
10 tokens, B is a fork of A that wrote one token (copy-on-write), and D came
and went (its full page is CACHED, its partial page FREE).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from cache_helpers import extend, small_cache  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from paged_np import viz  # noqa: E402
from paged_np.cache.kv_cache import Event  # noqa: E402
from paged_np.errors import IndexOutOfRange, InvalidArgument, ShapeError  # noqa: E402
from paged_np.viz import anim as viz_anim  # noqa: E402
from paged_np.viz import kernels as viz_kernels  # noqa: E402
from paged_np.viz import layouts as viz_layouts  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def cache():
    c = small_cache(num_pages=12, page_size=4)
    c.add_sequence("A", list(range(10)))
    extend(c, "A", list(range(10)))           # pages 0, 1, 2 (2 half full)
    c.fork("A", "B")
    extend(c, "B", [77])                      # B copies page 2 -> page 3
    c.tick()
    c.add_sequence("D", [50, 51, 52, 53, 54])
    extend(c, "D", [50, 51, 52, 53, 54])      # pages 4 (full), 5 (partial)
    c.tick()
    c.free("D")                               # 4 -> CACHED, 5 -> FREE
    c.check_invariants()
    return c


def _rects(ax):
    return [p for p in ax.patches if type(p) is Rectangle]


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_draw_arena_one_square_per_page_and_ref_counts(cache):
    fig = viz.draw_arena(cache)
    ax = fig.axes[0]
    assert isinstance(fig, Figure)
    assert len(_rects(ax)) == 12
    texts = _texts(ax)
    assert texts.count("x2") == 2             # pages 0 and 1 are shared by A and B
    assert "4\ncached" in texts
    colors = [r.get_facecolor() for r in _rects(ax)]
    assert colors[5] == matplotlib.colors.to_rgba(viz.STATE_COLORS["free"])
    assert colors[4] == matplotlib.colors.to_rgba(viz.STATE_COLORS["cached"])


def test_draw_block_tables_one_arrow_per_logical_page(cache):
    fig = viz.draw_block_tables(cache)
    ax = fig.axes[0]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 3 + 3               # A and B hold three logical pages each
    texts = _texts(ax)
    assert texts.count("L0") == 2 and texts.count("L2") == 2
    assert texts.count("x2") == 2             # shared pages 0 and 1 are marked
    # physical squares (12) + per logical page a frame and a fill (2 x 6)
    assert len(_rects(ax)) == 12 + 12


def test_draw_block_tables_of_chosen_sequences(cache):
    ax = viz.draw_block_tables(cache, seq_ids=["B"]).axes[0]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 3


def test_draw_lru_in_eviction_order():
    c = small_cache(num_pages=8, page_size=2)
    for sid, toks in (("x", [1, 2, 3, 4]), ("y", [5, 6])):
        c.add_sequence(sid, toks)
        extend(c, sid, toks)
    c.free("x")                               # pages 1, 0 cached (tail first)
    c.free("y")                               # page 2 cached
    ax = viz.draw_lru(c).axes[0]
    labels = [t for t in _texts(ax) if t.isdigit()]
    assert labels == [str(p) for p in c.pool.eviction_order()] == ["1", "0", "2"]
    assert len(_rects(ax)) == 3
    assert "next victim" in _texts(ax)


def test_draw_lru_empty():
    ax = viz.draw_lru(small_cache()).axes[0]
    assert _rects(ax) == [] and "no cached page" in _texts(ax)


def test_replay_events_matches_the_pool(cache):
    frames = viz.replay_events(cache.events, 12)
    assert [f[0] for f in frames] == ["step 0", "step 1", "step 2"]
    states = frames[-1][1]
    assert states == [cache.pool.state(p) for p in range(12)]
    assert frames[-1][2][3] == ["B"]          # the copy belongs to B
    per_event = viz.replay_events(cache.events, 12, by="event")
    assert len(per_event) == len(cache.events)
    with pytest.raises(InvalidArgument, match="by"):
        viz.replay_events(cache.events, 12, by="page")
    with pytest.raises(InvalidArgument, match="page_id"):
        viz.replay_events([Event(0, "allocate", 12, "A")], 12)


def test_state_counts_and_timeline(cache):
    c = viz.state_counts(cache.events, 12)
    assert list(c["step"]) == [0, 1, 2]
    assert list(c["in_use"]) == [4, 6, 4]
    assert list(c["cached"]) == [0, 0, 1]
    assert all(c["free"] + c["cached"] + c["in_use"] == 12)
    steps = [{"num_running": 1, "num_waiting": 2}, {"num_running": 2, "preemptions": 1},
             {"num_running": 1}]
    fig = viz.draw_timeline(cache.events, 12, steps=steps)
    assert len(fig.axes) == 2
    ax2 = fig.axes[1]
    labels = [t.get_text() for t in ax2.get_legend().get_texts()]
    assert labels == ["running", "waiting", "preemption"]
    assert len(ax2.lines) == 2 + 1 + 1        # two series, one preemption line, its legend
    assert len(viz.draw_timeline(cache.events, 12).axes) == 1


def test_timeline_marks_evictions():
    c = small_cache(num_pages=2, page_size=2)
    c.add_sequence("a", [1, 2, 3, 4])
    extend(c, "a", [1, 2, 3, 4])
    c.free("a")
    c.tick()
    c.add_sequence("b", [9, 9, 9])
    extend(c, "b", [9, 9, 9])                 # needs both pages: evicts both
    counts = viz.state_counts(c.events, 2)
    assert list(counts["evictions"]) == [0, 2]
    ax = viz.draw_timeline(c.events, 2).axes[0]
    assert len(ax.collections) == 3 + 1       # three stacked bands and the eviction marks


def test_animation_frames_and_html(cache):
    anim = viz_anim.animate_events(cache.events, 12)
    frames = viz.replay_events(cache.events, 12)
    anim._func(len(frames) - 1)               # draw the last frame
    ax = anim._fig.axes[0]
    assert ax.get_title(loc="left") == "step 2"
    colors = [r.get_facecolor() for r in _rects(ax)]
    assert colors[4] == matplotlib.colors.to_rgba(viz.STATE_COLORS["cached"])
    html = viz_anim.animation_html(anim)
    html = getattr(html, "data", html)
    assert "<script" in html and "animation" in html.lower()
    with pytest.raises(InvalidArgument, match="empty"):
        viz_anim.animate_events([], 12)


def test_slider_degrades_to_a_static_figure(cache):
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        fig = viz_anim.event_slider(cache.events, 12, static_frames=2)
        assert isinstance(fig, Figure) and len(fig.axes) == 2
        assert fig.axes[0].get_title(loc="left") == "step 0"
        assert fig.axes[1].get_title(loc="left") == "step 2"
    else:
        w = viz_anim.event_slider(cache.events, 12)
        assert w.children[0].max == 2


def test_online_softmax_trace_equals_softmax():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=8), rng.normal(size=(13, 8))
    t = viz_kernels.online_softmax_trace(q, k, page_size=4)
    s = k @ q / np.sqrt(8)
    assert np.allclose(t["scores"], s)
    assert np.allclose(t["weights"], np.exp(s - s.max()) / np.exp(s - s.max()).sum())
    assert np.isclose(t["lse"], np.log(np.exp(s).sum()))
    assert len(t["m"]) == 4 and np.all(np.diff(t["m"]) >= 0)       # the max only grows
    assert np.allclose(t["m"], [s[:4 * (i + 1)].max() for i in range(4)])
    assert np.isclose(t["l"][-1], np.exp(s - s.max()).sum())
    with pytest.raises(ShapeError):
        viz_kernels.online_softmax_trace(q, k[:, :4], page_size=4)


def test_draw_online_softmax_panels():
    rng = np.random.default_rng(1)
    fig = viz_kernels.draw_online_softmax(rng.normal(size=8), rng.normal(size=(10, 8)), 4)
    assert len(fig.axes) == 3
    assert len(fig.axes[0].patches) == 10 + 1   # one bar per key, the running-max stairs


def test_roofline_points_and_roofs():
    pts = [{"label": "a", "flops": 1e9, "bytes": 1e9, "seconds": 0.5},    # 2 GFLOP/s at 1
           {"label": "b", "flops": 8e9, "bytes": 1e9, "seconds": 1.0}]
    fig = viz_kernels.draw_roofline(pts, peak_bandwidth=4e9, peak_flops=16e9)
    ax = fig.axes[0]
    assert len(ax.lines) == 1 + 2                                  # the roof and two dots
    roof = ax.lines[0].get_ydata()
    assert np.isclose(roof.max(), 16e9)                            # flat compute roof
    assert [t.get_text() for t in ax.texts] == ["50%", "50%"]      # 2 of 4, 8 of 16 GFLOP/s
    with pytest.raises(InvalidArgument, match="seconds"):
        viz_kernels.draw_roofline([{"label": "x", "flops": 1, "bytes": 1}], 1e9)
    pair = [dict(pts[0], marker=m, color="C3") for m in ("o", "s")]  # one case, two layouts
    dots = viz_kernels.draw_roofline(pair, peak_bandwidth=4e9).axes[0].lines[1:]
    assert [d.get_marker() for d in dots] == ["o", "s"] and dots[0].get_color() == "C3"


@pytest.mark.parametrize("load", [0, 1, 7, 15])
def test_one_vector_load_is_one_key_in_hnd_and_one_dim_in_k_transposed(load):
    """16 consecutive addresses in both layouts: dims 0-15 of key ``load`` in hnd, dim
    ``load`` of keys 0-15 in k_transposed (the same element, read through page.T)."""
    page = np.arange(16 * 16).reshape(16, 16)                      # [P, D] element id
    for layout, memory in (("hnd", page), ("k_transposed", page.T.copy())):
        ld = viz_layouts.vector_load(16, 16, layout, load)
        assert np.array_equal(ld["address"], np.arange(16 * load, 16 * (load + 1)))
        assert np.array_equal(memory.reshape(-1)[ld["address"]], page[ld["key"], ld["dim"]])
    hnd = viz_layouts.vector_load(16, 16, "hnd", load)
    kt = viz_layouts.vector_load(16, 16, "k_transposed", load)
    assert set(hnd["key"]) == {load} and list(hnd["dim"]) == list(range(16))
    assert set(kt["dim"]) == {load} and list(kt["key"]) == list(range(16))
    assert "ONE score" in viz_layouts.describe_load(hnd)
    assert "each of 16 scores" in viz_layouts.describe_load(kt)


def test_a_short_key_spans_two_keys_per_load_and_bad_layouts_are_refused():
    ld = viz_layouts.vector_load(32, 8, "hnd", 1)                  # 8 dims per key
    assert list(ld["key"]) == [2] * 8 + [3] * 8
    with pytest.raises(InvalidArgument, match="layout"):
        viz_layouts.k_page_cells(16, 16, "nhd")
    with pytest.raises(InvalidArgument, match="whole number"):
        viz_layouts.vector_load(4, 6, "hnd")                       # 24 floats, 16 lanes
    with pytest.raises(IndexOutOfRange):
        viz_layouts.vector_load(16, 16, "hnd", load=16)            # 16 loads: 0..15


@pytest.mark.parametrize("load", [1, 9])
def test_draw_k_layouts_outlines_the_cells_of_one_load(load):
    """The red cells of each panel are 16 consecutive addresses (read off the numbers
    drawn in them) holding one key's colour in hnd and 16 keys' colours in
    k_transposed."""
    fig = viz.draw_k_layouts(16, 16, load=load)
    for ax, layout in zip(fig.axes, ("hnd", "k_transposed")):
        numbers = {(round(t.get_position()[1]), round(t.get_position()[0])): int(t.get_text())
                   for t in ax.texts}                              # (row, col) -> address
        assert sorted(numbers.values()) == list(range(256))
        red = [p for p in ax.patches if p.get_gid() == "load"]
        cells = [(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in red]
        assert sorted(numbers[c] for c in cells) == list(range(16 * load, 16 * (load + 1)))
        colours = {tuple(ax.images[0].get_array()[r, c]) for r, c in cells}
        assert len(colours) == (1 if layout == "hnd" else 16), layout
        assert ax.get_title(loc="left").startswith(f"{layout}: K page")


def test_draw_page_sweep_one_bar_per_layout_and_old_files():
    new = [{"page_size": 8, "gbs_hnd": 4.0, "gbs_k_transposed": 6.0},
           {"page_size": 16, "gbs_hnd": 5.0, "gbs_k_transposed": 7.0}]
    ax = viz_kernels.draw_page_sweep(new).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["K hnd", "K transposed"]
    assert sorted(p.get_height() for p in _rects(ax)) == [4.0, 5.0, 6.0, 7.0]
    old = [{"page_size": 8, "gbs": 4.0}, {"page_size": 16, "gbs": 5.0}]   # before layouts
    ax = viz_kernels.draw_page_sweep(old).axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["K hnd"]
    assert [p.get_height() for p in _rects(ax)] == [4.0, 5.0]
    with pytest.raises(InvalidArgument):
        viz_kernels.draw_page_sweep([{"page_size": 8}])


def test_step_series_from_engine_metrics_and_from_dicts():
    metrics = {"steps": 4, "series": {"step": [0, 1, 2, 3], "running": [1, 2, 2, 1],
                                      "waiting": [2, 1, 0, 0], "preemptions": [0, 1, 1, 3]}}
    s = viz.step_series(metrics)
    assert list(s["preemptions"]) == [0, 1, 0, 2]          # from the running total
    assert list(s["running"]) == [1, 2, 2, 1]
    assert list(viz.step_series(metrics["series"])["waiting"]) == [2, 1, 0, 0]
    d = viz.step_series([{"num_running": 3}, {"num_waiting": 1, "preemptions": 2}])
    assert list(d["running"]) == [3, 0] and list(d["preemptions"]) == [0, 2]


def test_timeline_with_engine_metrics(cache):
    metrics = {"series": {"running": [1, 2, 1], "waiting": [1, 0, 0], "preemptions": [0, 1, 1]}}
    ax2 = viz.draw_timeline(cache.events, 12, steps=metrics).axes[1]
    assert [t.get_text() for t in ax2.get_legend().get_texts()] == [
        "running", "waiting", "preemption"]
