"""Trace collection: run real speculative decoding with a fixed window and
record every drafted position's features with its verification outcome.

Labels follow WISP (appendix A.2): 1 for an accepted token, 0 for the first
rejected token of its round, -1 for positions after it (their outcome does not
exist: verification stops at the first rejection; training drops them). A
trace is an `.npz` of per-position arrays plus a JSON header (pair, models,
settings, prompt ids), written atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit.drafting import AcceptanceTracker, Decision
from edgekit.errors import ConfigError
from edgekit.runtime import DraftOutput

from .features import FEATURE_NAMES, LogitFeatures

__all__ = ["Trace", "TraceRecorder", "collect", "label_round", "load_prompts"]


def label_round(drafted: int, accepted: int) -> list[int]:
    """Labels of a round's drafted positions: accepted 1, the first rejection 0, after it -1."""
    if not 0 <= accepted <= drafted:
        raise ValueError(f"accepted {accepted} of {drafted} drafted")
    return [1] * accepted + ([0] if accepted < drafted else []) + [-1] * max(drafted - accepted - 1, 0)


@dataclass
class Trace:
    features: np.ndarray  # [N, len(FEATURE_NAMES)] float32
    label: np.ndarray  # [N] int8: 1 accepted, 0 first rejection, -1 after it
    prompt: np.ndarray  # [N] int32: index into header["prompts"]
    round: np.ndarray  # [N] int32: round index within its prompt's generation
    header: dict = field(default_factory=dict)

    def rows(self, keep: np.ndarray) -> Trace:
        """The rows `keep` selects (a mask or indices), with the same header."""
        return Trace(self.features[keep], self.label[keep], self.prompt[keep], self.round[keep], self.header)

    def labelled(self) -> Trace:
        return self.rows(self.label >= 0)

    def save(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(
                    f, features=self.features, label=self.label, prompt=self.prompt, round=self.round,
                    header=np.frombuffer(json.dumps(self.header).encode(), dtype=np.uint8),
                )
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a trace is ordinary data
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        with np.load(path) as z:
            header = json.loads(z["header"].tobytes().decode())
            if tuple(header.get("feature_names", ())) != FEATURE_NAMES:
                traced = header.get("feature_names")
                raise ConfigError(f"{path}: traced features {traced} are not {list(FEATURE_NAMES)}")
            return cls(z["features"], z["label"], z["prompt"], z["round"], header)

    @classmethod
    def concat(cls, traces: Sequence[Trace]) -> Trace:
        return cls(
            np.concatenate([t.features for t in traces]),
            np.concatenate([t.label for t in traces]),
            np.concatenate([t.prompt for t in traces]),
            np.concatenate([t.round for t in traces]),
            traces[0].header if traces else {},
        )


class TraceRecorder:
    """A fixed-window controller that records each position's features and,
    once the verdict is in, its label."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"record-fixed-{k}"
        self.acceptance = AcceptanceTracker()
        self.features = LogitFeatures()
        self._block: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.labels: list[int] = []
        self.rounds: list[int] = []
        self._round = 0

    def window(self, limit: int) -> int:
        return min(self.k, limit)

    def draft_next(self, index: int, step: DraftOutput) -> Decision:
        self._block.append(self.features(step.stats, index, self.acceptance.value).copy())
        return Decision.DRAFT

    def observe(self, drafted: int, accepted: int) -> None:
        # The last position's features may belong to a token the block never got
        # (the window or the end of text stopped it): only drafted ones count.
        block, self._block = self._block[:drafted], []
        self.rows.extend(block)
        self.labels.extend(label_round(drafted, accepted))
        self.rounds.extend([self._round] * drafted)
        self._round += 1
        self.acceptance.update(drafted, accepted)


def load_prompts(path: str | os.PathLike[str]) -> list[dict]:
    """A JSONL prompt set: one {"id", "prompt", ...} object per line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    row["id"], row["prompt"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise ConfigError(f"{path}:{n}: expected a JSON object with 'id' and 'prompt'") from exc
                out.append(row)
    return out


def collect(
    client,  # edgekit.EdgeClient
    prompts: Iterable[dict],
    *,
    window: int = 8,
    max_tokens: int = 64,
    mode: str = "greedy",
    seed: int = 0,
    on_prompt: Callable[[int, dict, int], None] | None = None,
) -> Trace:
    """Speculative decoding over `prompts` with a fixed window, recorded."""
    prompts = list(prompts)
    parts: list[Trace] = []
    t0 = time.perf_counter()
    committed = 0
    rounds = []
    for i, p in enumerate(prompts):
        rec = TraceRecorder(window)
        stream = client.generate(p["prompt"], controller=rec, max_tokens=max_tokens, mode=mode, seed=seed + i)
        final = stream.until_done()
        committed += final.stats.completion_tokens
        rounds.extend(final.stats.rounds_detail)
        n = len(rec.labels)
        parts.append(
            Trace(
                np.array(rec.rows, dtype=np.float32).reshape(n, len(FEATURE_NAMES)),
                np.array(rec.labels, dtype=np.int8),
                np.full(n, i, dtype=np.int32),
                np.array(rec.rounds, dtype=np.int32),
            )
        )
        if on_prompt:
            on_prompt(i, p, n)
    trace = Trace.concat(parts)
    server = client.server_info()
    trace.header = {
        "feature_names": list(FEATURE_NAMES),
        "draft": client.draft.name,
        "target": server.target_model,
        "mode": mode,
        "window": window,
        "max_tokens": max_tokens,
        "seed": seed,
        "prompts": [p["id"] for p in prompts],
        "committed_tokens": committed,
        "seconds": round(time.perf_counter() - t0, 1),
        "cost_model": fit_cost_model(rounds),
    }
    return trace


def fit_cost_model(rounds: Sequence) -> dict:  # Sequence[RoundStats]
    """Milliseconds per draft step, and a round's time as fixed + per-token cost
    (least squares of round-trip time on block length + 1), from measured rounds."""
    steps = sum(r.draft_steps for r in rounds)
    n = np.array([r.drafted + 1 for r in rounds], dtype=np.float64)
    t = np.array([r.round_trip_ms for r in rounds], dtype=np.float64)
    if len(rounds) < 2 or np.ptp(n) == 0:
        raise ConfigError("fitting the cost model needs rounds of at least two block lengths")
    slope, intercept = np.polyfit(n, t, 1)
    return {
        "draft_step_ms": sum(r.draft_ms for r in rounds) / max(steps, 1),
        "round_fixed_ms": float(max(intercept, 0.0)),
        "verify_token_ms": float(max(slope, 0.0)),
        "rounds": len(rounds),
    }
