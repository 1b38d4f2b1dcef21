"""The rejection predictors shipped with edgekit, one per model pair: an ONNX file with a
metric card (`<pair>.json`, and `<pair>.md` for people) in the `shipped/` folder of the
training tooling's package (`edgekit.predictors`, which writes them). Found here without
importing that package: the core reads the files, never the tooling's code."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

__all__ = ["read_cards", "shipped_cards", "shipped_dir", "shipped_predictor"]


def shipped_dir(package: str) -> Path:
    """`shipped/` inside an edgekit subpackage (`"predictors"`, `"semantic"`), located without
    running the package's code."""
    spec = importlib.util.find_spec(f"edgekit.{package}")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"edgekit.{package} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "shipped"


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
    return read_cards(shipped_dir("predictors"))


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
