"""`EdgeClient`: a draft model on this device, a verifier somewhere, one API.

The client puts together parts that each do one job: what it is made of (`_setup`), the
sessions it opens (`_session`), the verifier's target-only stream and its resume
(`_target_only`), many generations at once (`_many`), and which way an "auto" generation goes
(`_route`)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from ..config import ClientConfig, FirstRoute, GenerationConfig, ServerConfig
from ..drafting import Controller, ControllerFactory
from ..errors import IncompatibleModelsError
from ..link import CostTracker, LinkEstimator, LinkPolicy, ProbeResult, probe
from ..plan import Plan
from ..protocol import ServerInfo
from ..runtime import DraftModel, DraftPool
from ..transport import VerifierTransport
from ._chat import ChatTemplate, Conversation
from ._events import Event, FinalStats
from ._many import generate_many
from ._round import check_supported
from ._route import SPECULATIVE, STREAM, RouteChooser, may_stream
from ._session import SharedDraft, SpeculativeSession
from ._setup import DEFAULT_PAIR, assemble
from ._stream import GenerationStream
from ._target_only import TargetOnly

__all__ = ["DEFAULT_PAIR", "EdgeClient"]


class EdgeClient:
    """Speculative decoding with a local draft model and a verifier.

    verifier: "host:port" (or "grpc://host:port"), several of them (a list, or
    comma-separated) serving one target to fail over between, a transport object,
    or None to start the pair's target as a verifier on loopback in this process.

    pair: a registered draft/target pair. None (the default): with a verifier and no
    draft, the pair whose target the verifier serves (asked in a handshake before
    the draft loads, so the verifier must answer now; `edgekit.client.discover_pair`);
    otherwise DEFAULT_PAIR (gemma-270m).

    draft: the draft model, by reference (`edgekit.models.refs`: a registry name,
    "hf:ORG/REPO:QUANT", "ollama:NAME", a path to a GGUF), or a loaded `DraftModel` or
    `DraftPool`; default: the pair's. target: the model
    the local verifier serves (no verifier given), by reference; default: the pair's. A
    draft and a target named here are checked to share a tokenizer from their GGUF headers
    before any weights load (`IncompatibleModelsError` names both).

    draft_slots: how many generations may draft at once, each on a KV sequence of its
    own in one draft model, their steps batched (`edgekit.runtime.DraftPool`); with one
    (the default) concurrent generations take turns on the draft, and each switch
    re-prefills it. draft_context: tokens per
    sequence; draft_threads: CPU threads of the draft (default: EDGEKIT_THREADS, or all).
    """

    def __init__(
        self,
        verifier: str | Sequence[str] | VerifierTransport | None = None,
        *,
        pair: str | None = None,
        draft: str | Path | DraftModel | DraftPool | None = None,
        target: str | Path | None = None,
        config: ClientConfig | None = None,
        generation: GenerationConfig | None = None,
        local_server: ServerConfig | None = None,
        draft_slots: int = 1,
        draft_context: int = 4096,
        draft_threads: int | None = None,
    ) -> None:
        if draft_slots < 1:
            raise ValueError("draft_slots must be at least 1")
        self.config = config or ClientConfig()
        if self.config.first_route == "auto" and (pinned := os.environ.get("EDGEKIT_FIRST_ROUTE")):
            # a process-wide pin (tests, benchmarks); replace() checks the value as the config does
            self.config = replace(self.config, first_route=cast(FirstRoute, pinned))
        if not self.config.client_id:  # one id for this client's sessions (the verifier's budgets follow it)
            self.config = replace(self.config, client_id=uuid.uuid4().hex)
        self.generation = generation or GenerationConfig()
        self._parts = assemble(verifier, pair or None, draft, target,
                               self.config, local_server, draft_slots, draft_context, draft_threads)
        self.pair = self._parts.pair
        assert self._parts.transport is not None
        self.transport: VerifierTransport = self._parts.transport
        self._server: ServerInfo | None = None
        self._shared = SharedDraft(self.draft)  # the draft model serves one round at a time
        self._factory: ControllerFactory | None = None  # made at the handshake: it needs the target's name
        self.link = LinkEstimator()  # this device's view of its link to the verifier
        # What a round costs besides the link (draft step, verify line, acceptance), per mode, learnt
        # across generations: a policy then decides from the first round of the next one.
        self._costs: dict[str, CostTracker] = {}
        # Whether an "auto" generation drafts or streams the target's tokens: from what each cost here.
        self.routes = RouteChooser()
        self._target_only = TargetOnly(self.transport, self.draft, self.config, self._session)

    @property
    def draft(self) -> DraftModel:
        assert self._parts.draft is not None
        return self._parts.draft

    @property
    def local_verifier_address(self) -> str | None:
        return self._parts.local.address if self._parts.local else None

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

    def recommended_sampling(self) -> dict[str, float]:
        """The sampler settings the target's GGUF recommends (from the handshake), which shape the
        output, else those of the draft's GGUF, by GenerationConfig name; {} where neither says."""
        target = self.server_info().recommended_sampling
        return dict(target) if target else getattr(self.draft, "sampling_defaults", dict)()

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
        return self._session(self._config(overrides), controller)

    def _session(self, gen: GenerationConfig, controller: Controller | None = None) -> SpeculativeSession:
        server = self.server_info()
        pool = self._parts.pool
        slot = pool.acquire() if pool is not None else None
        try:
            return SpeculativeSession(
                slot or self.draft,
                self.transport,
                server,
                gen,
                controller=controller,
                controller_factory=self._controller_factory(),
                shared=SharedDraft(slot) if slot is not None else self._shared,
                link=self.link,
                client=self.config,
                on_close=slot.close if slot is not None else None,
                costs=self._costs.setdefault(gen.mode, CostTracker()),
            )
        except BaseException:
            if slot is not None:
                slot.close()
            raise

    def generate_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        concurrency: int | None = None,
        return_exceptions: bool = False,
        plan: Plan | None = None,
        **overrides: Any,
    ) -> list[FinalStats | BaseException]:
        """Generates for every prompt, `concurrency` at a time (by default as many as the draft
        has slots): while one's block is being verified, the others draft, and drafting steps
        that coincide run as one batch. Results in the prompts' order, each exactly what the
        prompt would give alone. A generation that fails fails alone: its error stands in its
        place with `return_exceptions`, else the first is raised once the others are done.

        With a `plan` (`edgekit.plan.plan`, `edgekit plan`): every task at once, drafting the
        plan's window, the tasks of each batch starting every round together."""
        pool = self._parts.pool
        return generate_many(
            self.generate, prompts, workers=max(1, concurrency or (pool.slots if pool is not None else 1)),
            free_slots=pool.free_slots() if pool is not None and plan is not None else 0, plan=plan,
            return_exceptions=return_exceptions, overrides=overrides,
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
        policy = LinkPolicy(gen, self.link, hidden_dim=self.draft.n_embd, n_vocab=self.draft.n_vocab,
                            costs=self._costs.setdefault(gen.mode, CostTracker()))
        return self._controller_factory().build(gen, policy)

    def generate(
        self, prompt: str | Sequence[int], *, controller: Controller | None = None, **overrides: Any
    ) -> GenerationStream:
        """Speculative generation; overrides are GenerationConfig fields.

        With drafting "auto" and `stream_when_faster` (the defaults), a generation may be the
        verifier's target-only stream instead, where this client measured that faster than
        drafting (`edgekit.client.RouteChooser`; `stats.drafting` says "target-only"). Either
        way the output is the target's, and a stream cut off by an outage goes on speculatively
        from what it delivered."""
        gen = self._config(overrides)
        tokens = self.tokenize(prompt)
        chosen = controller is None and may_stream(gen)
        if chosen:
            # where the verifier says what its step takes, a draft step is timed here (half of it
            # where drafting overlaps the rounds, as `RouteChooser.observe` counts it)
            draft_ms = (lambda: self._shared.step_ms(tokens) / (2 if gen.proactive else 1)) if tokens else lambda: 0.0
            self.routes.expect_first(self.config.first_route, lambda: self.server_info().decode_step_ms, draft_ms)
            # what a session would refuse (logprobs the verifier cannot give, say), refused whichever route
            check_supported(gen, self.server_info(), self.transport.address)
        route = self.routes.choose(gen.mode) if chosen else SPECULATIVE
        if route == STREAM:
            streamed = self._target_only.events(tokens, gen, resume=True)
            return GenerationStream(self.routes.measured(gen, STREAM, streamed))
        session = self._session(gen, controller)

        def events() -> Iterator[Event]:
            prefill_ms = session.open(tokens)
            yield from session.stream(prefill_ms=prefill_ms)

        measured = self.routes.measured(gen, SPECULATIVE, events()) if chosen else events()
        return GenerationStream(measured, on_close=session.close)

    def generate_target_only(self, prompt: str | Sequence[int], **overrides: Any) -> GenerationStream:
        """The centralized baseline: the verifier's target decodes every token."""
        gen = self._config(overrides)
        self.server_info()
        return GenerationStream(self._target_only.events(self.tokenize(prompt), gen, resume=False))

    def close(self) -> None:
        self._parts.close()

    def __enter__(self) -> EdgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
