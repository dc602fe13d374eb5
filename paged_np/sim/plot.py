"""Figures and the text table of ``python -m paged_np simulate``.

Every function takes the results dict of :func:`paged_np.sim.simulate.run` (or the
JSON it writes) and returns a matplotlib ``Figure`` or a string; nothing is
shown on screen (the Agg backend), so they work in scripts, tests and CI:

- :func:`plot_breakdown`: the paper's Fig. 2, stacked bars of where KV memory
  goes, for Orca's three reservations and for paged allocation;
- :func:`plot_savings`: KV saved by sharing (Fig. 15), with the paper's ranges;
- :func:`plot_policies`: prefix-cache hit rate against cache size, per policy;
- :func:`plot_all`: the three side by side; :func:`report`: a text summary.
"""

from __future__ import annotations

from ..viz.arena import pyplot

# pyplot without forcing a backend: Jupyter keeps its inline one, scripts get Agg.
plt = pyplot()

CATEGORIES = ("token_states", "reservation", "internal_frag", "external_frag")
LABELS = {"token_states": "token states", "reservation": "reservation",
          "internal_frag": "internal frag.", "external_frag": "external frag. & others"}
COLORS = {"token_states": "#4c72b0", "reservation": "#dd8452",
          "internal_frag": "#c44e52", "external_frag": "#8c8c8c"}
#: Colors of the eviction policies' curves, in the order the results list them.
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3")
SCHEME_LABELS = {"orca_max": "Orca\n(Max)", "orca_pow2": "Orca\n(Pow2)",
                 "orca_oracle": "Orca\n(Oracle)", "paged": "paged\n(16)"}


def _axes(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def plot_breakdown(res: dict, ax=None):
    """Stacked bars: share of KV slots per category, ShareGPT, each scheme."""
    fig, ax = _axes(ax, (5, 4))
    mb = res["memory_breakdown"]
    names = list(SCHEME_LABELS)
    bottom = [0.0] * len(names)
    for c in CATEGORIES:
        vals = [100 * mb[n][c] for n in names]
        ax.bar(range(len(names)), vals, bottom=bottom, color=COLORS[c], label=LABELS[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, n in enumerate(names):
        ax.text(i, 100 * mb[n]["token_states"] / 2, f"{100 * mb[n]['token_states']:.1f}%",
                ha="center", va="center", color="white", fontsize=8)
    ax.set_xticks(range(len(names)), [SCHEME_LABELS[n] for n in names])
    ax.set_ylabel("KV cache memory (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Where KV memory goes (ShareGPT-like)")
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_savings(res: dict, ax=None):
    """Bars: KV saved by sharing per width, the paper's range shaded grey behind each group."""
    fig, ax = _axes(ax, (5, 4))
    by = res["sharing_savings"]["by_dataset"]
    x, ticks, labels = 0.0, [], []
    for kind, color in (("parallel_sampling", "#4c72b0"), ("beam_search", "#55a868")):
        for d in ("alpaca", "sharegpt"):
            widths = by[kind][d]
            lo, hi = res["paper"][kind][d]
            ax.fill_between([x - 0.5, x + len(widths) - 0.5], 100 * lo, 100 * hi,
                            color="#d0d0d0", zorder=0)
            ax.text(x + (len(widths) - 1) / 2, -9, f"{kind.split('_')[0]}\n{d}",
                    ha="center", va="top", fontsize=7)
            for w, v in widths.items():
                ax.bar(x, 100 * v, color=color)
                ticks.append(x)
                labels.append(w)
                x += 1
            x += 0.6
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("KV memory saved by sharing (%)")
    ax.set_title("Sharing savings by width n / k (grey: paper's range)")
    return fig


def plot_policies(res: dict, ax=None):
    """Hit rate against cache size for each eviction policy (chat: solid, few-shot: dashed)."""
    fig, ax = _axes(ax, (5, 4))
    for key, style, name in (("policies", "-", "chat"), ("policies_fewshot", "--", "few-shot")):
        # One color per policy, in the order they were run (the registry's, lru first).
        for i, (pol, curve) in enumerate(res[key].items()):
            ax.plot([p["cache_pages"] for p in curve], [100 * p["hit_rate"] for p in curve],
                    style, marker="o", ms=3, color=PALETTE[i % len(PALETTE)],
                    label=f"{pol} ({name})")
        ax.axhline(100 * res["max_reusable"]["chat" if name == "chat" else "fewshot"],
                   ls=":", color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("cache size (pages of 16 tokens)")
    ax.set_ylabel("prompt tokens reused (%)")
    ax.set_title("Prefix-cache hit rate by eviction policy")
    ax.legend(fontsize=7)
    return fig


def plot_all(res: dict):
    """The three figures side by side in one Figure."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    plot_breakdown(res, axes[0])
    plot_savings(res, axes[1])
    plot_policies(res, axes[2])
    fig.tight_layout()
    return fig


def report(res: dict) -> str:
    """A text summary: the breakdown, the savings and the best hit rates."""
    lines = ["memory breakdown, ShareGPT-like (% of KV slots; batch = mean running requests)",
             f"{'scheme':<12}" + "".join(f"{LABELS[c][:14]:>16}" for c in CATEGORIES) + "   batch"]
    for n, v in res["memory_breakdown"].items():
        lines.append(f"{n:<12}" + "".join(f"{100 * v[c]:>15.1f}%" for c in CATEGORIES)
                     + f"{v['batch_size']:>8.1f}")
    lines.append("\nKV saved by sharing (%), widths " + ", ".join(res["config"].get(
        "widths_str", map(str, res["config"]["widths"]))))
    for kind, by in res["sharing_savings"]["by_dataset"].items():
        for d, w in by.items():
            lo, hi = res["paper"][kind][d]
            lines.append(f"  {kind:<18} {d:<9} " + " ".join(f"{100 * x:5.1f}" for x in w.values())
                         + f"   (paper {100 * lo:.1f}-{100 * hi:.1f})")
    lines.append("\nprefix-cache hit rate at the smallest / largest cache (chat trace)")
    for pol, curve in res["policies"].items():
        lines.append(f"  {pol:<5} {100 * curve[0]['hit_rate']:5.1f}% @ {curve[0]['cache_pages']}"
                     f" pages   {100 * curve[-1]['hit_rate']:5.1f}% @ {curve[-1]['cache_pages']}")
    lines.append(f"  maximum reusable: {100 * res['max_reusable']['chat']:.1f}%")
    return "\n".join(lines)
