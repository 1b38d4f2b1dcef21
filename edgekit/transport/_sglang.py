"""`SGLangTransport`: verification through SGLang's native `/generate`, one request a round.

Each round sends the token ids of committed tokens plus the draft block as `input_ids`, with
`return_logprob`, `top_logprobs_num` (1 greedy, the sampler's top-k sampling) and
`logprob_start_len` one position before the block, and asks for one new token at temperature 0.
SGLang computes only what its radix cache does not hold (the prefix is shared with the last
round), from `logprob_start_len` on; the entry exactly at `logprob_start_len` carries no
log-probabilities (its predecessor's logits were never computed in this request), hence the
position before the block. `meta_info.input_top_logprobs[j]` is the top-k (logprob, token id,
text) the token at input position `logprob_start_len + j` was drawn against, so entries 1..n
are the block's; `output_top_logprobs[0]` (and `output_token_logprobs[0]`, the greedy token) is
the row after the block. Ids throughout: nothing is re-tokenized. A request past the model's
context length (SGLang answers 400) is LimitExceededError.

Written against SGLang's documented request and response fields and tested against a local
server that follows them (tests/http_fakes.py): SGLang does not run on the machines this was
built on (its CPU kernels are not on PyPI); not yet run against a real SGLang deployment.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import LimitExceededError, ProtocolError
from ..runtime import DraftModel
from ._http import HttpJson
from ._stateless import TOKENIZER_PROBE, StatelessTransport

__all__ = ["SGLangTransport"]


class SGLangTransport(StatelessTransport):
    backend = "sglang"
    kind = "SGLang server"
    prefix_cache = True  # the radix cache keeps the shared prefix between requests
    samples = True  # top_logprobs_num: the top-k at every position asked for
    max_logprobs = 1024  # SGLang sets no cap of its own; this bounds what one round's answer carries

    def __init__(self, url: str, tokenizer: DraftModel, *, timeout: float = 30.0, token: str | None = None,
                 max_block: int = 16, max_context: int = 4096) -> None:
        super().__init__(HttpJson(url, timeout=timeout, token=token, kind=self.kind), tokenizer,
                         max_context=max_context, max_block=max_block)

    def _discover(self) -> str:
        info = self.http.request("GET", "/get_model_info", during="asking for its model")
        name = info.get("model_path") or info.get("model_name")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"{self.kind} at {self.address} did not name its model", address=self.address)
        if info.get("is_generation") is False:
            raise ProtocolError(
                f"{self.kind} at {self.address} serves {name!r}, which does not generate", address=self.address
            )
        return name

    def _generate(
        self, tokens: Sequence[int], *, start: int, new: int, during: str, texts: bool = False, k: int = 1
    ) -> dict:
        body = {
            "input_ids": list(tokens),
            "sampling_params": {"max_new_tokens": new, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": k,
            "return_text_in_logprobs": texts,
        }
        try:
            data = self.http.request("POST", "/generate", body, during=during)
        except ProtocolError as exc:
            if exc.code == "400" and "context length" in str(exc):  # SGLang's words for an input too long
                raise LimitExceededError(str(exc), address=self.address, code=exc.code) from None
            raise
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            raise ProtocolError(f"{self.kind} at {self.address} sent no meta_info", address=self.address)
        return meta

    def _check_tokenizer(self, draft_model: str) -> str:
        """The server's text for each id of a probe text's tokens, against the draft's."""
        ours = self.tokenizer.tokenize(TOKENIZER_PROBE, add_special=True)
        meta = self._generate(ours, start=0, new=1, during="naming a probe text's tokens", texts=True)
        entries = meta.get("input_token_logprobs")
        if not isinstance(entries, list) or len(entries) != len(ours):
            raise ProtocolError(f"{self.kind} at {self.address} sent no input_token_logprobs", address=self.address)
        for i, (entry, tok) in enumerate(zip(entries, ours)):
            if not (isinstance(entry, (list, tuple)) and len(entry) >= 3):
                raise ProtocolError(f"{self.kind} at {self.address} sent a malformed input_token_logprobs entry",
                                    address=self.address)
            mine = self.tokenizer.token_bytes(tok).decode("utf-8", errors="ignore")
            if entry[1] != tok or (entry[2] is not None and entry[2] != mine and i > 0):
                raise self._incompatible(draft_model, f"token {tok} is {entry[2]!r} there, {mine!r} here")
        return "token texts of a probe text's ids"

    def _rows(self, tokens: Sequence[int], start: int, k: int) -> tuple[list, list]:
        """The block's top-k entries (the input positions start..end) and the row after it, from one
        request asking from the position before the block (see the module's docstring)."""
        if start < 1:
            raise ProtocolError("a block needs at least one committed token before it", address=self.address)
        meta = self._generate(tokens, start=start - 1, new=1, during="verifying a block", k=k)
        tops, out = meta.get("input_top_logprobs"), meta.get("output_top_logprobs")
        n = len(tokens) - start
        if not isinstance(tops, list) or len(tops) != n + 1 or not isinstance(out, list) or not out:
            raise ProtocolError(
                f"{self.kind} at {self.address} sent no input_top_logprobs for the block (is return_logprob "
                "with logprob_start_len supported?)",
                address=self.address,
            )
        block = tops[1:]
        if any(not isinstance(row, list) or not row for row in [*block, out[0]]):
            raise ProtocolError(f"{self.kind} at {self.address} sent a position of the block without its "
                                "log-probabilities", address=self.address)
        return block, out[0]

    def _top1(self, tokens: Sequence[int], start: int) -> list[int]:
        block, after = self._rows(tokens, start, 1)
        best: list[int] = []
        for j, row in enumerate(block):
            best.append(_token_id(row[0], self.address))
            if best[-1] != tokens[start + j]:
                return best
        best.append(_token_id(after[0], self.address))
        return best

    def _topk(self, tokens: Sequence[int], start: int, k: int) -> list[dict[int, float]]:
        block, after = self._rows(tokens, start, k)
        rows = []
        for row in [*block, after]:
            top = {_token_id(e, self.address): _logprob(e, self.address) for e in row}
            if len(top) < k:
                raise ProtocolError(f"{self.kind} at {self.address} returned {len(top)} of the {k} likeliest "
                                    "tokens at a position", address=self.address)
            rows.append(top)
        return rows

    def _generate_ids(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        meta = self._generate(tokens, start=len(tokens), new=max_tokens, during="generating")
        out = meta.get("output_token_logprobs")
        if not isinstance(out, list):
            raise ProtocolError(f"{self.kind} at {self.address} sent no output_token_logprobs", address=self.address)
        return [_token_id(e, self.address) for e in out]


def _logprob(entry: object, address: str) -> float:
    """The log-probability of a (logprob, token_id, text) entry."""
    if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], (int, float)):
        return float(entry[0])
    raise ProtocolError(f"SGLang server at {address} sent a malformed logprob entry {entry!r}", address=address)


def _token_id(entry: object, address: str) -> int:
    """The id of a (logprob, token_id, text) entry."""
    if isinstance(entry, (list, tuple)) and len(entry) >= 2 and isinstance(entry[1], int):
        return entry[1]
    raise ProtocolError(f"SGLang server at {address} sent a malformed logprob entry {entry!r}", address=address)
