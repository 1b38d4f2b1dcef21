"""The predictors shipped with edgekit, one per model pair, each an ONNX file
with a metric card (`<pair>.json`, and `<pair>.md` for people) in `shipped/`."""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["SHIPPED_DIR", "read_cards", "shipped_cards", "shipped_predictor"]

SHIPPED_DIR = Path(__file__).parent / "shipped"


def read_cards(directory: Path) -> list[dict]:
    """The metric cards (`*.json`) in a directory of shipped ONNX models, each with its model's path
    under "path" (the semantic heads' directory is read the same way)."""
    cards = []
    for card_path in sorted(directory.glob("*.json")):
        card = json.loads(card_path.read_text())
        card["path"] = str(card_path.with_suffix(".onnx"))
        cards.append(card)
    return cards


def shipped_cards() -> list[dict]:
    """Every shipped predictor's card, with its ONNX path under "path"."""
    return read_cards(SHIPPED_DIR)


def shipped_predictor(draft: str, target: str, mode: str = "greedy") -> Path | None:
    """The shipped predictor trained on this draft and target (and acceptance mode), if any."""
    return _by_models().get((draft, target, mode))


@functools.cache
def _by_models() -> dict[tuple[str, str, str], Path]:
    """(draft, target, mode) -> predictor, read once: every session asks (drafting "auto")."""
    index: dict[tuple[str, str, str], Path] = {}
    for card in shipped_cards():
        index.setdefault((card["draft"], card["target"], card.get("mode", "greedy")), Path(card["path"]))
    return index
