"""The semantic heads shipped with edgekit, one per pair, each with its metric card
(`shipped/<pair>.onnx`, `.json` with the figures, `.md` to read)."""

from __future__ import annotations

from pathlib import Path

from edgekit.drafting import read_cards
from edgekit.errors import SemanticHeadError

__all__ = ["SHIPPED_DIR", "shipped_head", "shipped_head_cards"]

SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_head_cards() -> list[dict]:
    """Every shipped head's card, with its ONNX path under "path"."""
    return read_cards(SHIPPED_DIR)


def shipped_head(pair: str) -> Path:
    """The head shipped for `pair`; a clear error when there is none."""
    path = SHIPPED_DIR / f"{pair}.onnx"
    if not path.is_file():
        have = ", ".join(c["pair"] for c in shipped_head_cards()) or "none"
        raise SemanticHeadError(
            f"no semantic head is shipped for pair {pair!r} (shipped: {have}); train one with "
            "`edgekit semantic collect`, `label` and `train`, and pass it with --semantic-head FILE"
        )
    return path
