"""Perplexity per segment of a long text, one line per attention setting (StreamingLLM's
figure), from the JSON ``python -m paged_np eval --long-text --json`` writes."""

from __future__ import annotations

from .arena import pyplot

#: Line colours by the kind of run its label names.
COLORS = {"full": "#4c72b0", "window": "#c44e52", "sinks": "#55a868"}


def _color(label: str) -> str:
    kind = "sinks" if "sinks" in label else "window" if label.startswith("window") else "full"
    return COLORS[kind] if kind in label else "#8172b2"


def draw_segment_perplexity(data: dict, ax=None, title: str | None = None):
    """One line per run: perplexity of each segment of ``data["segment"]`` tokens, and
    the pages each run held at most. ``data``: the eval's JSON (a dict). Returns the Figure."""
    plt = pyplot()
    fig, ax = (plt.subplots(figsize=(8, 4)) if ax is None else (ax.figure, ax))
    seg = data["segment"]
    for run in data["runs"]:
        ppl = run["segment_perplexity"]
        x = [(i + 0.5) * seg for i in range(len(ppl))]             # segment midpoints
        label = f"{run['label']} (at most {max(run['pages_in_use'], default=0)} pages)"
        ax.plot(x, ppl, marker="o", ms=3, color=_color(run["label"]), label=label)
    ax.set_xlabel("position in the text (tokens)")
    ax.set_ylabel(f"perplexity per {seg:,} tokens")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{data['text'].get('model', '')}: perplexity past the window")
    return fig
