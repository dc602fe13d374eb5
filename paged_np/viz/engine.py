"""Drawings of an engine run (from ``engine.metrics["series"]``). Functions return a Figure.

- top: the pages of the arena at each step, stacked by state (IN_USE, CACHED,
  FREE), with the steps that preempted a request marked;
- bottom: running and waiting requests at each step.

Used by ``python -m paged_np demo``; a notebook can call it on any engine.
"""

from __future__ import annotations

import numpy as np

from .arena import STATE_COLORS, pyplot


def draw_engine_run(metrics: dict, title: str = "paged_np engine run"):
    """Pages by state and requests by queue over the steps of a run."""
    plt = pyplot()
    s = metrics["series"]
    steps = np.asarray(s["step"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.stackplot(steps, s["num_in_use"], s["num_cached"], s["num_free"],
                  labels=["in use", "cached (reusable, evictable)", "free"],
                  colors=[STATE_COLORS["in_use"], STATE_COLORS["cached"], STATE_COLORS["free"]],
                  step="post")
    pre = np.flatnonzero(np.diff(np.asarray(s["preemptions"]), prepend=0) > 0)  # step indices
    if pre.size:
        top.plot(steps[pre], np.full(pre.size, metrics["num_pages"]), "v", color="#c44e52",
                 markersize=6, clip_on=False, label="preemption")
    top.set_ylim(0, metrics["num_pages"])
    top.set_ylabel("pages")
    top.set_title(title)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)

    bottom.step(steps, s["running"], where="post", color=STATE_COLORS["in_use"], label="running")
    bottom.step(steps, s["waiting"], where="post", color="#c44e52", label="waiting")
    bottom.set_xlabel("engine step")
    bottom.set_ylabel("requests")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    return fig
