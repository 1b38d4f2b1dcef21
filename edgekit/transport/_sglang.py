"""`SGLangTransport`: greedy verification through SGLang's native `/generate`.

Each round sends the token ids of committed tokens plus the draft block as
`input_ids`, with `return_logprob`, `logprob_start_len` at the block's first
position and `top_logprobs_num: 1`, and one new token at temperature 0.
`meta_info.input_top_logprobs[j]` is the top-1 (logprob, token id, text) at
input position start + j, the distribution that position's token was drawn
against; `meta_info.output_token_logprobs[0]` is the greedy token after the
block. Ids throughout, so nothing is re-tokenized; SGLang's radix cache reuses
the shared prefix of successive requests on the server.

Written against SGLang's documented request and response fields and tested
against a local server implementing them (tests/http_fakes.py); not yet run
against a real SGLang deployment.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ProtocolError
from ..runtime import DraftModel
from ._http import HttpJson
from ._stateless import TOKENIZER_PROBE, StatelessTransport

__all__ = ["SGLangTransport"]


class SGLangTransport(StatelessTransport):
    backend = "sglang"
    kind = "SGLang server"
    prefix_cache = True  # the radix cache keeps the shared prefix between requests

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

    def _generate(self, tokens: Sequence[int], *, start: int, new: int, during: str, texts: bool = False) -> dict:
        body = {
            "input_ids": list(tokens),
            "sampling_params": {"max_new_tokens": new, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": 1,
            "return_text_in_logprobs": texts,
        }
        data = self.http.request("POST", "/generate", body, during=during)
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

    def _top1(self, tokens: Sequence[int], start: int) -> list[int]:
        meta = self._generate(tokens, start=start, new=1, during="verifying a block")
        tops, out = meta.get("input_top_logprobs"), meta.get("output_token_logprobs")
        n = len(tokens) - start
        if not isinstance(tops, list) or len(tops) < n or not isinstance(out, list) or not out:
            raise ProtocolError(
                f"{self.kind} at {self.address} sent no input_top_logprobs for the block (is return_logprob "
                "with logprob_start_len supported?)",
                address=self.address,
            )
        best: list[int] = []
        for j in range(n):
            best.append(_token_id(tops[j][0] if isinstance(tops[j], list) and tops[j] else None, self.address))
            if best[-1] != tokens[start + j]:
                return best
        best.append(_token_id(out[0], self.address))
        return best

    def _generate_ids(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        meta = self._generate(tokens, start=len(tokens), new=max_tokens, during="generating")
        out = meta.get("output_token_logprobs")
        if not isinstance(out, list):
            raise ProtocolError(f"{self.kind} at {self.address} sent no output_token_logprobs", address=self.address)
        return [_token_id(e, self.address) for e in out]


def _token_id(entry: object, address: str) -> int:
    """The id of a (logprob, token_id, text) entry."""
    if isinstance(entry, (list, tuple)) and len(entry) >= 2 and isinstance(entry[1], int):
        return entry[1]
    raise ProtocolError(f"SGLang server at {address} sent a malformed logprob entry {entry!r}", address=address)
