"""`EdgeClient`: a draft model on this device, a verifier somewhere, one API."""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ClientConfig, GenerationConfig, ServerConfig
from ..drafting import Controller, ControllerFactory
from ..errors import IncompatibleModelsError
from ..link import LinkEstimator, LinkPolicy, ProbeResult, probe
from ..protocol import ServerInfo, SpeedObjective
from ..runtime import DraftModel, LlamaDraftModel
from ..transport import VerifierTransport, connect
from ._chat import ChatTemplate, Conversation
from ._events import Event, FinalStats, TextDelta
from ._metrics import GenerationStats
from ._session import SharedDraft, SpeculativeSession
from ._stream import GenerationStream
from ._text import TextDecoder

if TYPE_CHECKING:
    from ..verifier import VerifierServer

__all__ = ["EdgeClient"]


class EdgeClient:
    """Speculative decoding with a local draft model and a verifier.

    verifier: "host:port" (or "grpc://host:port"), several of them (a list, or
    comma-separated) serving one target to fail over between, a transport object,
    or None to start the pair's target as a verifier on loopback in this process.
    """

    def __init__(
        self,
        verifier: str | Sequence[str] | VerifierTransport | None = None,
        *,
        pair: str = "gemma-270m",
        draft_model: str | Path | DraftModel | None = None,
        config: ClientConfig | None = None,
        generation: GenerationConfig | None = None,
        local_server: ServerConfig | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        if not self.config.client_id:  # one id for this client's sessions (the verifier's budgets follow it)
            self.config = replace(self.config, client_id=uuid.uuid4().hex)
        self.generation = generation or GenerationConfig()
        self.pair = pair
        self._local: VerifierServer | None = None
        self._draft: DraftModel | None = None
        # Close only what this client made: a draft model or transport passed in
        # belongs to the caller.
        self._owns_draft = not hasattr(draft_model, "eval")
        target = ",".join(verifier) if isinstance(verifier, (list, tuple)) else verifier
        assert not isinstance(target, Sequence) or isinstance(target, str)
        self._owns_transport = target is None or isinstance(target, str)
        try:
            self._draft = self._load_draft(draft_model)
            if target is None:
                self._local = self._start_local(local_server)
                target = self._local.address
            self.transport: VerifierTransport = (
                connect(target, self.config, self._draft) if isinstance(target, str) else target
            )
        except BaseException:
            self.close()
            raise
        self._server: ServerInfo | None = None
        self._shared = SharedDraft(self.draft)  # the draft model serves one round at a time
        self._factory: ControllerFactory | None = None  # made at the handshake: it needs the target's name
        self.link = LinkEstimator()  # this device's view of its link to the verifier

    def _load_draft(self, draft_model: str | Path | DraftModel | None) -> DraftModel:
        if draft_model is None:
            from ..models import get_pair, model_path

            spec = get_pair(self.pair)
            return LlamaDraftModel(model_path(spec.draft), name=spec.draft)
        if isinstance(draft_model, (str, Path)):
            return LlamaDraftModel(draft_model)
        return draft_model

    def _start_local(self, server_config: ServerConfig | None) -> VerifierServer:
        from ..models import get_pair, model_path
        from ..verifier import VerifierServer

        spec = get_pair(self.pair)
        cfg = server_config or ServerConfig(port=0, max_sessions=4)
        return VerifierServer(model_path(spec.target), replace(cfg, host="127.0.0.1"), name=spec.target).start()

    @property
    def draft(self) -> DraftModel:
        assert self._draft is not None
        return self._draft

    @property
    def local_verifier_address(self) -> str | None:
        return self._local.address if self._local else None

    def server_info(self) -> ServerInfo:
        """Handshakes once; refuses a target whose tokenizer differs from the draft's."""
        if self._server is None:
            d = self.draft
            info = self.transport.handshake(d.fingerprint(), draft_model=d.name, draft_hidden_size=d.n_embd)
            if not info.target_fingerprint.same_tokenizer(d.fingerprint()):
                raise IncompatibleModelsError(
                    f"draft model {d.name!r} does not share a tokenizer with target model {info.target_model!r}"
                )
            self._server = info
        return self._server

    def tokenize(self, prompt: str | Sequence[int], *, special: bool = True) -> list[int]:
        """Text to token ids with the draft's tokenizer (shared with the target);
        special=False adds no BOS (for text appended to a conversation)."""
        return self.draft.tokenize(prompt, add_special=special) if isinstance(prompt, str) else list(prompt)

    def token_text(self, token: int) -> str:
        """A token's text, special tokens included (e.g. '<|im_end|>')."""
        return self.draft.token_bytes(token, special=True).decode("utf-8", errors="replace")

    def chat_template(self) -> ChatTemplate:
        """The target's chat template (from the handshake), else the draft's, else plain turns."""
        d = self.draft
        fp = d.fingerprint()
        source = self.server_info().chat_template or d.chat_template()
        bos = self.token_text(fp.bos_token) if fp.bos_token >= 0 else ""
        eos = self.token_text(fp.eos_token) if fp.eos_token >= 0 else ""
        return ChatTemplate(source, bos_token=bos, eos_token=eos)

    def conversation(self, *, system: str | None = None, **overrides: Any) -> Conversation:
        """A multi-turn chat kept on one verifier session (KV caches reused across turns)."""
        return Conversation(self, system=system, **overrides)

    def chat(self, messages: Sequence[dict] | str, **overrides: Any) -> GenerationStream:
        """One reply to a list of {"role", "content"} messages (or one user message)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        prompt = self.chat_template().render(messages, add_generation_prompt=True)
        return self.generate(self.tokenize(prompt), **overrides)

    def session(self, *, controller: Controller | None = None, **overrides: Any) -> SpeculativeSession:
        """A session for several turns; `generate` opens and closes one per call.
        `controller` replaces the drafting policy the config names."""
        gen = self._config(overrides)
        server = self.server_info()
        return SpeculativeSession(
            self.draft,
            self.transport,
            server,
            gen,
            controller=controller,
            controller_factory=self._controller_factory(),
            shared=self._shared,
            link=self.link,
            client=self.config,
        )

    def _config(self, overrides: dict[str, Any]) -> GenerationConfig:
        return replace(self.generation, **overrides) if overrides else self.generation

    def _controller_factory(self) -> ControllerFactory:
        if self._factory is None:
            self._factory = ControllerFactory(self.draft.name, self.server_info().target_model)
        return self._factory

    def probe_link(self, **options: Any) -> ProbeResult:
        """Measures RTT, jitter, rates and loss with timed pings (see `edgekit.link.probe`)."""
        return probe(self.transport, self.link, **options)

    def controller_for(self, gen: GenerationConfig) -> Controller:
        """The drafting controller `gen.drafting` names (see GenerationConfig), on this client's link."""
        policy = LinkPolicy(gen, self.link, hidden_dim=self.draft.n_embd, n_vocab=self.draft.n_vocab)
        return self._controller_factory().build(gen, policy)

    def generate(
        self, prompt: str | Sequence[int], *, controller: Controller | None = None, **overrides: Any
    ) -> GenerationStream:
        """Speculative generation; overrides are GenerationConfig fields."""
        session = self.session(controller=controller, **overrides)
        tokens = self.tokenize(prompt)

        def events() -> Iterator[Event]:
            prefill_ms = session.open(tokens)
            yield from session.stream(prefill_ms=prefill_ms)

        return GenerationStream(events(), on_close=session.close)

    def generate_target_only(self, prompt: str | Sequence[int], **overrides: Any) -> GenerationStream:
        """The centralized baseline: the verifier's target decodes every token."""
        gen = self._config(overrides)
        self.server_info()
        tokens = self.tokenize(prompt)
        seed = gen.seed if gen.seed is not None else secrets.randbits(63)

        def events() -> Iterator[Event]:
            stats = GenerationStats(mode=gen.mode, draft_k=0, prompt_tokens=len(tokens))
            decoder = TextDecoder(self.draft)
            out: list[int] = []
            parts: list[str] = []
            start = time.perf_counter()
            for t in self.transport.generate(
                tokens,
                mode=gen.mode,
                temperature=gen.temperature,
                seed=seed,
                max_tokens=gen.max_tokens,
                slo=SpeedObjective(gen.slo_class, gen.target_speed),
            ):
                out.append(t.token)
                stats.rounds += 1
                stats.server_verify_ms += t.decode_ms
                if stats.time_to_first_token_ms is None:
                    stats.time_to_first_token_ms = (time.perf_counter() - start) * 1e3
                text = decoder.feed([t.token])
                parts.append(text)
                yield TextDelta(text, (t.token,))
                stats.finish_reason = t.finish_reason or stats.finish_reason
            parts.append(decoder.flush())
            stats.completion_tokens = len(out)
            stats.elapsed_s = time.perf_counter() - start
            yield FinalStats(stats, tuple(out), "".join(parts))

        return GenerationStream(events())

    def close(self) -> None:
        transport = getattr(self, "transport", None)
        if transport is not None and self._owns_transport:
            transport.close()
        if self._local is not None:
            self._local.stop()
            self._local = None
        if self._draft is not None and self._owns_draft and hasattr(self._draft, "close"):
            self._draft.close()
        self._draft = None

    def __enter__(self) -> EdgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
