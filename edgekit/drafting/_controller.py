"""The drafting controller seam: how long a block to draft this round.

Each round the session asks `window(limit)` for the most tokens to draft, then,
for each block position in turn, calls `draft_next(index, step)` with the
draft step for that position (a `DraftOutput`: its logits, and their softmax
statistics in `step.stats`, shared with the greedy token choice) *before* a
token is taken from it, and gets
a `Decision`: DRAFT the token and go on; STOP, ending the block without it
(WISP's stop-at-first-predicted-rejection, eq. 25, and llama.cpp's draft p-min
both stop this way, which costs the draft step that produced the logits); or
LAST, drafting this token and then ending the block (the token's logits are
already paid for: sending it costs only its verification). A plain bool works
as DRAFT/STOP. The verdict comes back through `observe`.

- `FixedWindow`: the SLED-style baseline, always K tokens (less only where the
  output or context limit leaves less room, or the draft ends the text).
- `PredictorController`: stop at the first rejection a predictor foresees;
  `ConfidenceThreshold` is that rule on the draft's top probability alone
  (llama.cpp's `--draft-p-min`).
- `LatencyWindow`: the window the latency model expects fastest on the link.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Literal, Protocol

from ..runtime import DraftOutput

__all__ = ["Controller", "Decision", "FixedWindow", "StopRule"]

StopRule = Literal["before", "after"]  # end a block before the predicted rejection, or after it


class Decision(IntEnum):
    """A controller's answer at a block position: DRAFT the token and go on, STOP before it (the
    block ends without it), or LAST (draft it, then end the block)."""

    STOP = 0
    DRAFT = 1
    LAST = 2

    @classmethod
    def stop(cls, rule: StopRule) -> Decision:
        """What a predicted rejection means under `rule`."""
        return cls.STOP if rule == "before" else cls.LAST


class Controller(Protocol):
    """How long a block to draft each round (the drafting seam; see this module): `window`
    bounds it, `draft_next` decides at each position, `observe` takes the verdict. `name`
    shows in the stats. `GenerationConfig.drafting` names the built-in ones;
    `EdgeClient.generate(controller=...)` takes any object of this shape."""

    name: str

    def window(self, limit: int) -> int:
        """The most tokens to draft this round, given at most `limit` fit."""

    def draft_next(self, index: int, step: DraftOutput) -> Decision | bool:
        """What to do at block position `index` (1-based), given its draft step."""

    def observe(self, drafted: int, accepted: int) -> None:
        """The verdict of the round."""


class FixedWindow:
    """Always `k` tokens a round (SLED's baseline), fewer only where the output or context limit
    leaves less room or the draft ends the text."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"fixed-{k}"

    def window(self, limit: int) -> int:
        return min(self.k, limit)

    def draft_next(self, index: int, step: DraftOutput) -> Decision:
        return Decision.DRAFT

    def observe(self, drafted: int, accepted: int) -> None:
        pass
