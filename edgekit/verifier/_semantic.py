"""Semantic verification on the verifier (WISV sec. III-A step 3, V-C): lossy, opt-in.

A session opened in mode "semantic" is verified as in greedy mode, except at
mismatches (block offsets whose draft token is not the target's top-1): there,
in order, the decision head reads the draft's hidden row (uploaded FH or SH),
the target's hidden row at the same offset (from the same target pass, which
then asks the engine for them), the CSI of the link state the device sent
with the round (and, for a head trained to read it, the target's logits row
there with the draft's token), and the first mismatch whose P(reject) passes the session's
threshold ends the block with the target's token. Mismatches before it are
accepted and counted.

A verifier offers the mode only with a head (`edgekit serve --semantic-head`);
opening a semantic session elsewhere, without hidden uploads, with a draft whose
hidden size is not the head's, or with a threshold outside [0, 1] is refused
with the reason, and nothing is opened.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..errors import ProtocolError, SemanticHeadError
from ..protocol import LinkState, accept_semantic, top1_mismatches

__all__ = ["DecisionHead", "SemanticMode"]


class DecisionHead(Protocol):
    """What the verifier needs of a head (`edgekit.semantic.SemanticHead` is one)."""

    identity: str
    threshold: float
    draft_hidden: int
    target_hidden: int

    def check_pair(self, draft_hidden: int, target_hidden: int) -> None: ...

    def p_reject(
        self,
        h_draft: np.ndarray,
        h_target: np.ndarray,
        link: LinkState | None,
        logits: np.ndarray | None = None,
        draft_tokens: np.ndarray | None = None,
    ) -> np.ndarray:
        """P(reject) of each mismatch, from both hidden rows, the link, and (for a head that reads
        the target's confidence) the target's logits rows and the draft's tokens there."""
        ...


class SemanticMode:
    """The verifier's semantic decisions over one head (or none: the mode is refused)."""

    def __init__(self, head: DecisionHead | None, target_hidden: int) -> None:
        self.head = head
        if head is not None and head.target_hidden != target_hidden:
            raise SemanticHeadError(
                f"the semantic head {head.identity} reads a {head.target_hidden}-wide target hidden "
                f"state; this verifier's target has {target_hidden}"
            )

    @property
    def offered(self) -> bool:
        return self.head is not None

    @property
    def identity(self) -> str:
        return self.head.identity if self.head is not None else ""

    @property
    def default_threshold(self) -> float:
        return float(self.head.threshold) if self.head is not None else 0.0

    def check_open(self, draft_hidden_size: int, threshold: float) -> None:
        if self.head is None:
            raise ProtocolError(
                "acceptance mode semantic is not offered by this verifier: it has no semantic decision head "
                "(start it with `edgekit serve --semantic-head FILE|shipped`); use greedy or sample",
                code="FAILED_PRECONDITION",
            )
        if not (math.isfinite(threshold) and 0.0 <= threshold <= 1.0):
            raise ProtocolError(f"the semantic threshold must be in [0, 1], got {threshold}")
        if not draft_hidden_size:
            raise ProtocolError(
                "semantic mode reads the draft's hidden states: open the session with draft_hidden_size "
                "and upload them (fh or sh)"
            )
        try:
            self.head.check_pair(draft_hidden_size, self.head.target_hidden)
        except SemanticHeadError as exc:
            raise ProtocolError(str(exc), code="FAILED_PRECONDITION") from None

    def decide(
        self,
        logits: np.ndarray,
        block: Sequence[int],
        draft_rows: tuple[tuple[int, ...], np.ndarray] | None,
        target_rows: np.ndarray | None,
        threshold: float,
        link: LinkState | None,
    ) -> tuple[int, int, int]:
        """(accepted, next token, mismatches accepted). `draft_rows`: the uploaded rows and
        their block offsets (every offset under FH, the mismatches under SH); `target_rows`:
        the target's hidden rows of the block's K+1 positions."""
        best = np.argmax(logits, axis=1)  # once: the mismatches and the verdict both read it
        mismatches = top1_mismatches(best, block)
        if not mismatches:
            return accept_semantic(best, block, [], threshold)
        if draft_rows is None or target_rows is None or self.head is None:
            raise ProtocolError(
                f"the round has mismatches at block offsets {mismatches} and semantic mode needs the draft's "
                "hidden states there; upload them (fh or sh)"
            )
        offsets, rows = draft_rows
        where = {o: i for i, o in enumerate(offsets)}
        missing = [m for m in mismatches if m not in where]
        if missing:
            raise ProtocolError(f"no draft hidden states for mismatches at block offsets {missing}")
        # A draft token past the target's logits (a padding entry only the draft has) is rejected
        # whatever the head would say: the head reads the mismatches before it, and none after.
        width = logits.shape[1]
        heard = next((n for n, m in enumerate(mismatches) if not 0 <= block[m] < width), len(mismatches))
        read = mismatches[:heard]
        p: list[float] = []
        if read:
            h_draft = rows[[where[m] for m in read]]
            p = self.head.p_reject(
                h_draft, target_rows[read], link, logits=logits[read], draft_tokens=np.asarray(block)[read]
            ).tolist()
        return accept_semantic(best, block, p + [math.inf] * (len(mismatches) - heard), threshold)
