"""vLLM's token-in/token-out route: a round in one request that reads the prefix cache.

vLLM started with `--enable-scale-out` serves `POST /inference/v1/generate`, which takes token ids
and any `SamplingParams`. A round asks for the committed tokens plus the draft block with
`max_tokens: 1, temperature: 0, prompt_logprobs: k, logprobs: k` and
`skip_reading_prefix_cache: false` (it defaults to true whenever prompt log-probabilities are
asked, which is why the completions route recomputes the whole context every round). The answer's
`prompt_logprobs[i]` maps token ids to the log-probability and rank each had as the token at
position i (the prompt's own token among them, whatever its rank); `choices[0]` holds the greedy
token after the block and its top-k. So the round costs what the cache does not hold: the block,
and the tail of the context past the last full KV block (vLLM caches whole blocks only; the CPU
build's default block is 128 tokens, `--block-size 16` makes it 32).

Positions served from the cache come back with whatever their rows' memory held (vLLM issue 42019:
the prompt log-probabilities are computed for the tokens the request computes only): only the
block's positions are read, and they must have been computed. vLLM says how many tokens it served
from the cache when started with `--enable-prompt-tokens-details` (`usage.prompt_tokens_details.
cached_tokens`); the route is taken only where it says, and a round whose block (or the token
before it, whose logits predict the block's first) was served from the cache is read by the
prefixes instead (one-token completions, which compute the positions they ask for). That happens
where an earlier request held the same tokens in a full KV block: a round sent again after a
failure, or another session that decoded the same text.

Prompt log-probabilities cost a row of the LM head for every position the request computes (262,144
columns for gemma-3), where a plain prefill computes one: a fresh context of 1,000 tokens took 10.6 s
as a round against 2.5 s as a plain prefill and 0.2 s for the round after it (vLLM's CPU build,
gemma-3-270m). So a session's prompt, and any extension of it of `PREFILL_FROM` tokens or more, is
sent first as a plain one-token request (`prefill_body`), whose whole KV blocks the cache keeps:
its rounds then compute the tail and the block only.

vLLM 0.32 cannot write an answer holding a non-finite log-probability, which the cached rows'
memory sometimes does: it answers 400, "Out of range float values are not JSON compliant"
(`UNWRITABLE`). Such a round is read by the prefixes too (the completions API writes its rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ProtocolError

__all__ = ["GENERATE_PATH", "PREFILL_FROM", "UNWRITABLE", "GenerateRows", "generate_body", "prefill_body"]

GENERATE_PATH = "/inference/v1/generate"
UNWRITABLE = "not JSON compliant"  # vLLM's 400 for an answer with an infinite log-probability in it
# Tokens a session adds (its prompt, an extension) from which they are prefilled by a plain request
# before a round reads them: below, the round's rows for them cost less than a request (two KV blocks)
PREFILL_FROM = 64


def generate_body(model: str, tokens: Sequence[int], k: int) -> dict[str, Any]:
    """One round's request: the target's top-k at every prompt position and after it, greedily."""
    return {
        "model": model,
        "token_ids": list(tokens),
        "sampling_params": {
            "max_tokens": 1, "temperature": 0, "prompt_logprobs": k, "logprobs": k, "detokenize": False,
            "skip_reading_prefix_cache": False,
        },
        "stream": False,
    }


def prefill_body(model: str, tokens: Sequence[int]) -> dict[str, Any]:
    """A plain one-token request of `tokens`, no log-probabilities: the prefix cache keeps their
    whole KV blocks, and the LM head runs at the last position only."""
    return {"model": model, "token_ids": list(tokens),
            "sampling_params": {"max_tokens": 1, "temperature": 0, "detokenize": False}, "stream": False}


class GenerateRows:
    """A round's answer read: the target's rows at the block's positions and after it, and its
    greedy token after the block."""

    def __init__(self, answer: dict, tokens: Sequence[int], start: int, address: str) -> None:
        self.address = address
        prompt = answer.get("prompt_logprobs")
        choices = answer.get("choices")
        if not isinstance(prompt, list) or len(prompt) != len(tokens):
            raise ProtocolError(f"vLLM at {address} sent no prompt_logprobs for the block", address=address)
        if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
            raise ProtocolError(f"vLLM at {address} sent a generation without choices", address=address)
        self.block: list[dict | None] = list(prompt[start:])
        self.cached = cached_tokens(answer)
        # the block's rows were computed by this request: none served from the cache, none missing
        self.fresh = self.cached is not None and self.cached <= start - 1 and all(
            isinstance(row, dict) and row for row in self.block)
        choice = choices[0]
        ids = choice.get("token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if not (isinstance(ids, list) and ids and isinstance(ids[0], int)):
            raise ProtocolError(f"vLLM at {address} generated no token after the block", address=address)
        if not (isinstance(content, list) and content and isinstance(content[0], dict)):
            raise ProtocolError(f"vLLM at {address} sent no log-probabilities with its token", address=address)
        self.generated: int = ids[0]
        self._after = content[0].get("top_logprobs") or []

    def best(self, tokens: Sequence[int], start: int) -> list[int]:
        """The target's greedy token at each block position up to the first that differs from the
        draft's (a draft token tied with the best is taken), or all of them and the one after."""
        out: list[int] = []
        for j, row in enumerate(self.block):
            entries = self._entries(row)
            own = entries.get(tokens[start + j])
            peak = max(entries.values())
            if own is not None and own >= peak:
                out.append(tokens[start + j])
                continue
            out.append(max(entries, key=lambda t: entries[t]))
            return out
        out.append(self.generated)
        return out

    def top_k(self, k: int) -> list[dict[int, float]]:
        """The k likeliest tokens and their log-probabilities at each block position and after it."""
        rows = [self._ranked(row, k) for row in self.block]
        after = {int(e["token_id"]): float(e["logprob"]) for e in self._after
                 if isinstance(e, dict) and isinstance(e.get("token_id"), int) and _rank(e) <= k}
        rows.append(after)
        if any(len(r) < k for r in rows):
            raise ProtocolError(f"vLLM at {self.address} returned fewer than the {k} likeliest tokens at a position",
                                address=self.address)
        return rows

    def _entries(self, row: dict | None) -> dict[int, float]:
        if not isinstance(row, dict) or not row:
            raise ProtocolError(f"vLLM at {self.address} sent a block position without log-probabilities",
                                address=self.address)
        try:
            return {int(t): float(v["logprob"]) for t, v in row.items()}
        except (TypeError, ValueError, KeyError):
            raise ProtocolError(f"vLLM at {self.address} sent malformed prompt_logprobs",
                                address=self.address) from None

    def _ranked(self, row: dict | None, k: int) -> dict[int, float]:
        entries = self._entries(row)
        assert isinstance(row, dict)
        return {int(t): entries[int(t)] for t, v in row.items() if _rank(v) <= k}


def _rank(entry: Any) -> int:
    rank = entry.get("rank") if isinstance(entry, dict) else None
    return rank if isinstance(rank, int) else 1 << 30


def cached_tokens(answer: dict) -> int | None:
    """How many of the request's tokens vLLM served from its prefix cache; None where it does not
    say (started without --enable-prompt-tokens-details)."""
    details = (answer.get("usage") or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None
