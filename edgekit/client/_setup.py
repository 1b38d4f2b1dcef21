"""What a client is made of before its first generation: the draft (a model, or a slot of a
pool of them), the local verifier of a client given none, and a transport that asks a
verifier which pair it serves before any draft is loaded."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ClientConfig, ServerConfig
from ..errors import ConfigError
from ..runtime import DraftModel, DraftPool, LlamaDraftModel, LlamaPoolBackend
from ..transport import VerifierTransport, connect, needs_tokenizer

if TYPE_CHECKING:
    from ..verifier import VerifierServer

__all__ = ["discovery_transport", "load_draft", "start_local"]


def discovery_transport(url: str, config: ClientConfig) -> VerifierTransport:
    """A transport to ask the verifier which target it serves, before a draft is loaded: ours
    (gRPC) answer that; a stock server's transport needs the draft's tokenizer first."""
    if needs_tokenizer(url):
        raise ConfigError(
            f"a stock verifier ({url}) cannot say which target it serves before a draft is loaded; "
            "name the pair (pair=..., --pair)"
        )
    return connect(url, config, None)


def load_draft(
    pair: str,
    draft_model: str | Path | DraftModel | DraftPool | None,
    slots: int,
    n_ctx: int,
    threads: int | None,
) -> tuple[DraftModel, DraftPool | None]:
    """The draft model (by default the pair's) and the pool it is a slot of, if any: with several
    slots (or a pool given), the pool's first slot, which sessions share when every other slot is
    taken."""
    name = None
    if draft_model is None:
        from ..models import get_pair, model_path

        spec = get_pair(pair)
        draft_model, name = model_path(spec.draft), spec.draft
    if isinstance(draft_model, (str, Path)):
        if slots == 1:
            return LlamaDraftModel(draft_model, name=name, n_ctx=n_ctx, n_threads=threads), None
        draft_model = DraftPool(
            LlamaPoolBackend(draft_model, slots=slots, n_ctx_seq=n_ctx, name=name, n_threads=threads)
        )
    if isinstance(draft_model, DraftPool):
        first = draft_model.acquire()
        if first is None:
            raise ValueError("the draft pool has no free slot")
        return first, draft_model
    if slots > 1:
        raise ValueError("draft_slots > 1 needs a model path (or a DraftPool), not a draft model object")
    return draft_model, None


def start_local(pair: str, server_config: ServerConfig | None) -> VerifierServer:
    """The pair's target as a verifier on loopback, in this process, with the pair's shipped
    semantic head where there is one (`semantic_head=""` opts out)."""
    from ..models import get_pair, model_path
    from ..verifier import VerifierServer

    spec = get_pair(pair)
    cfg = server_config or ServerConfig(port=0, max_sessions=4)
    if cfg.semantic_head is None:
        from .. import drafting  # the file, found without importing the semantic tooling

        head = drafting.shipped_dir("semantic") / f"{pair}.onnx"
        if head.is_file():
            cfg = replace(cfg, semantic_head=str(head))
    return VerifierServer(model_path(spec.target), replace(cfg, host="127.0.0.1"), name=spec.target).start()
