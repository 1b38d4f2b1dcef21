"""Figures a command can write (`--plot FILE`): matplotlib, from the bench extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure(ncols: int = 1, *, width: float = 5.5, height: float = 4.0) -> tuple[Any, list[Any]]:
    """A figure (no display needed) and its axes; DependencyMissingError naming the extra without matplotlib."""
    from edgekit.errors import DependencyMissingError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise DependencyMissingError("matplotlib", "bench") from exc
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
