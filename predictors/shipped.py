"""The predictors shipped with edgekit, one per model pair, each an ONNX file
with a metric card (`<pair>.json`, and `<pair>.md` for people) in `shipped/`."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SHIPPED_DIR", "shipped_cards", "shipped_predictor"]

SHIPPED_DIR = Path(__file__).parent / "shipped"


def shipped_cards() -> list[dict]:
    """Every shipped predictor's card, with its ONNX path under "path"."""
    cards = []
    for card_path in sorted(SHIPPED_DIR.glob("*.json")):
        card = json.loads(card_path.read_text())
        card["path"] = str(card_path.with_suffix(".onnx"))
        cards.append(card)
    return cards


def shipped_predictor(draft: str, target: str, mode: str = "greedy") -> Path | None:
    """The shipped predictor trained on this draft and target (and acceptance mode), if any."""
    for card in shipped_cards():
        if card["draft"] == draft and card["target"] == target and card.get("mode", "greedy") == mode:
            return Path(card["path"])
    return None
