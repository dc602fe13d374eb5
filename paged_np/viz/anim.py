"""The cache in motion: an animation of ``cache.events`` and a slider over it.

Both replay an event log with :func:`paged_np.viz.replay_events` and draw each
frame as an arena grid. In a notebook::

    from IPython.display import HTML
    from paged_np import viz
    HTML(viz.animation_html(viz.animate_events(cache.events, 16)))

or, with ``ipywidgets`` installed (the ``notebooks`` extra), a slider that
steps through the frames: ``viz.event_slider(cache.events, 16)``. Without
ipywidgets the slider degrades to a static figure of a few frames, so a
notebook runs the same everywhere.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from .arena import STATE_COLORS, draw_frame, owner_color, pyplot, replay_events


def animate_events(events, num_pages: int, by: str = "step", cols: int = 16,
                   interval_ms: int = 700, max_frames: int = 200):
    """A ``matplotlib.animation.FuncAnimation`` of the arena, one frame per step.

    ``by="event"`` gives one frame per event (slow motion). At most
    ``max_frames`` frames are kept (the last ones). The rectangles are drawn
    once and only recoloured per frame, so long logs stay cheap.
    """
    plt = pyplot()
    from matplotlib.animation import FuncAnimation

    frames = replay_events(events, num_pages, by=by)[-max_frames:]
    if not frames:
        raise InvalidArgument("events is empty: there is nothing to animate")
    fig = draw_frame(frames[0], cols=cols)
    ax = fig.axes[0]
    rects = [p for p in ax.patches if isinstance(p, plt.Rectangle)]  # [num_pages]
    texts = list(ax.texts)                                            # [num_pages]

    def update(i):
        label, states, owners = frames[i]
        for p, (rect, text) in enumerate(zip(rects, texts)):
            st = states[p]
            rect.set_facecolor(owner_color(owners[p][0]) if st == "in_use" and owners[p]
                               else STATE_COLORS[st])
            extra = (",".join(map(str, owners[p]))[:10] if st == "in_use"
                     else "cached" if st == "cached" else "")
            text.set_text(f"{p}\n{extra}".strip())
        ax.set_title(label, fontsize=9, loc="left")
        return rects + texts

    return FuncAnimation(fig, update, frames=len(frames), interval=interval_ms, blit=False)


def animation_html(anim) -> object:
    """The animation as HTML for Jupyter (``to_jshtml``); closes its figure.

    Returns an ``IPython.display.HTML`` when IPython is there, else the string.
    """
    html = anim.to_jshtml(default_mode="once")
    pyplot().close(anim._fig)
    try:
        from IPython.display import HTML
    except ImportError:
        return html
    return HTML(html)


def event_slider(events, num_pages: int, by: str = "step", cols: int = 16,
                 static_frames: int = 4):
    """An ipywidgets slider over the frames, or a static figure without ipywidgets.

    The static fallback stacks ``static_frames`` frames spread evenly over the
    log (always the first and the last), one arena grid per row. Either way,
    make it the last expression of a cell to show it.
    """
    frames = replay_events(events, num_pages, by=by)
    if not frames:
        raise InvalidArgument("events is empty: there is nothing to show")
    try:
        import ipywidgets as widgets
    except ImportError:
        return _static_frames(frames, cols, static_frames)
    from IPython.display import display

    plt = pyplot()

    def show(i):
        fig = draw_frame(frames[i], cols=cols)
        display(fig)  # into the widget's output area
        plt.close(fig)

    slider = widgets.IntSlider(min=0, max=len(frames) - 1, value=0, description="frame")
    return widgets.interactive(show, i=slider)


def _static_frames(frames, cols: int, k: int):
    plt = pyplot()
    k = max(1, min(k, len(frames)))
    picks = sorted({round(j * (len(frames) - 1) / max(1, k - 1)) for j in range(k)})
    n = len(frames[0][1])
    cols = min(n, cols)
    rows = -(-n // cols)
    fig, axes = plt.subplots(len(picks), 1, figsize=(max(4, cols * 0.7),
                                                     len(picks) * (rows * 0.75 + 0.6)),
                             squeeze=False)
    for ax, i in zip(axes[:, 0], picks):
        draw_frame(frames[i], ax=ax, cols=cols)
    fig.tight_layout()
    # Detach from pyplot: Jupyter then shows it once, as the cell's value, like a widget.
    plt.close(fig)
    return fig
