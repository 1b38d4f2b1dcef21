"""The figures drawn beside each result's JSON (matplotlib, behind the bench extra; no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def subplots(
    ncols: int = 1, *, nrows: int = 1, width: float = 6.0, height: float = 4.2
) -> tuple[Any, list[Any]]:
    """A matplotlib figure (no display needed) and its `nrows` x `ncols` axes, row by row (the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig: Any, path: Path) -> Path:
    """Writes the figure as a PNG beside the benchmark's JSON, gridded and with legends, and closes it."""
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:  # labelled lines, no legend yet
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
