"""``volsample bench``'s charts: the speed-up against PyTorch per operator family and
against each other library, on log axes, in a colour-blind-safe palette (README, the
performance page and ``--plot``)."""
from __future__ import annotations

import numpy as np

from .bench_report import PEER_TITLES, by_family, family_title, short_ratio
from .bench_timing import Result

CHART_WIDTH = 8.5  # inches: 850 px at 100 dpi, the width of the documentation's column


# Okabe and Ito's colour-blind-safe palette (yellow last: faint on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#000000",
           "#F0E442")


def write_plot(path, results):
    """``plot`` written to ``path`` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plot(results)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ratio_rows(ax, rows, xlabel):
    """One row per (title, colour, ratios): a bar from 1 to the median, a dot per workload,
    the median and the count written beside; log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    everything = [x for _, _, ratios in rows for x in ratios]
    low, high = min(everything + [1.0]), max(everything + [1.0])
    for k, (_, colour, ratios) in enumerate(rows):
        ratios = np.sort(np.asarray(ratios, dtype=float))
        median = float(np.median(ratios))
        ax.barh(k, median - 1, 0.7, left=1, color=colour, alpha=0.3, edgecolor=colour)
        spread = np.resize([0.0, -0.2, 0.2], len(ratios))  # neighbours apart
        ax.scatter(ratios, k + spread, s=42, color=colour, edgecolor="black", linewidth=0.6,
                   zorder=3)
        ax.text(max(ratios.max(), median) * 1.15, k,
                f"median {short_ratio(median)} ({len(ratios)} workload"
                f"{'s' * (len(ratios) > 1)})", va="center", fontsize=11)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    # room right of the highest dot for its row's label: about 40% of the axis' width
    left, label = np.log10(min(low, 1.0) / 1.6), np.log10(high * 1.15)
    right = (label - 0.4 * left) / 0.6
    ax.set_xlim(10 ** left, 10 ** right)
    decades = right - left
    subs = (1.0, 2.0, 5.0) if decades < 3.5 else (1.0, 3.0) if decades < 4.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(range(len(rows)), [title for title, _, _ in rows], fontsize=12)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.tick_params(axis="x", labelsize=11)
    ax.set_xlabel(xlabel, fontsize=12)
    ax.grid(axis="x", color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _against_pytorch_rows(results):
    rated = [r for r in results if r.implementation == "pytorch" and r.ratio is not None]
    rows = []
    for k, (key, names) in enumerate(by_family(rated).items()):
        ratios = [r.ratio for r in rated if r.workload in names]
        rows.append((family_title(key), PALETTE[k % len(PALETTE)], ratios))
    return rows


# the libraries beside PyTorch, in the second chart (volsample's own variants are in the
# tables, not charted)
_OTHER_LIBRARIES = ("scipy", "volresample", "simpleitk", "torch-interpol", "affiners", "jax")


def _against_others_rows(results):
    rows = []
    for k, peer in enumerate(p for p in _OTHER_LIBRARIES
                             if any(r.implementation == p for r in results)):
        ratios = [r.ratio for r in results if r.implementation == peer and r.ratio is not None]
        rows.append((PEER_TITLES[peer], PALETTE[k % len(PALETTE)], ratios))
    return rows


def plot_against_pytorch(results: list[Result], ax=None):
    """The speed-up against PyTorch per operator family (``FAMILIES``): PyTorch's time over
    volsample's, one dot per workload, a bar to the family's median, on a log axis. The
    matplotlib figure."""
    import matplotlib.pyplot as plt

    rows = _against_pytorch_rows(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(CHART_WIDTH, 0.55 * len(rows) + 1.3), layout="constrained")
    _ratio_rows(ax, rows, "PyTorch's time / volsample's (above 1: volsample is faster)")
    return ax.figure


def plot_against_others(results: list[Result], ax=None):
    """The speed-up against each library other than PyTorch (SciPy, volresample, SimpleITK,
    torch-interpol, affiners, JAX: those in ``results``), drawn as ``plot_against_pytorch``."""
    import matplotlib.pyplot as plt

    rows = _against_others_rows(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(CHART_WIDTH, 0.55 * len(rows) + 1.3), layout="constrained")
    _ratio_rows(ax, rows, "the library's time / volsample's (above 1: volsample is faster)")
    return ax.figure


def plot(results):
    """The speed-ups of a run: against PyTorch per operator family, then against each
    other library, on log axes (``plot_against_pytorch``, ``plot_against_others``; a chart
    with no rows is left out). The matplotlib figure."""
    import matplotlib.pyplot as plt

    charts = [(draw, rows) for draw, rows in ((plot_against_pytorch, _against_pytorch_rows(results)),
                                              (plot_against_others, _against_others_rows(results)))
              if rows]
    heights = [0.55 * len(rows) + 1.3 for _, rows in charts] or [1.0]
    fig, axes = plt.subplots(len(heights), 1, figsize=(CHART_WIDTH, sum(heights)),
                             height_ratios=heights, layout="constrained", squeeze=False)
    for (draw, _), ax in zip(charts, axes[:, 0]):
        draw(results, ax)
    return fig
