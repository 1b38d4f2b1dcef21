"""`EdgeClient`: a draft model on this device, a verifier somewhere, one API."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ClientConfig, GenerationConfig, ServerConfig
from ..drafting import Controller, ControllerFactory, FixedWindow
from ..errors import ConfigError, IncompatibleModelsError, VerifierUnavailableError
from ..link import CostTracker, LinkEstimator, LinkPolicy, ProbeResult, probe
from ..plan import Paced, Phaser, Plan
from ..protocol import ContextSpan, ServerInfo, SpeedObjective
from ..runtime import (
    DraftModel,
    DraftPool,
    DraftSlot,
)
from ..transport import VerifierTransport, connect, needs_tokenizer
from ._accumulator import StatsAccumulator
from ._chat import ChatTemplate, Conversation
from ._discover import check_remote_draft, discover_pair
from ._events import Event, FinalStats, Provisional, Resumed, RoundEvent, TextDelta
from ._metrics import GenerationStats
from ._resilience import through_outages
from ._round import check_supported
from ._route import SPECULATIVE, STREAM, RouteChooser
from ._session import SharedDraft, SpeculativeSession
from ._setup import discovery_transport, load_draft, model_file, start_local
from ._stream import GenerationStream
from ._text import TextDecoder

if TYPE_CHECKING:
    from ..verifier import VerifierServer

__all__ = ["DEFAULT_PAIR", "EdgeClient"]

DEFAULT_PAIR = "gemma-270m"
"""The pair of a client given no verifier (its target is started locally) and no pair."""


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
    `DraftPool` (`draft_model` is its older name); default: the pair's. target: the model
    the local verifier serves (no verifier given), by reference; default: the pair's. A
    draft and a target named here are checked to share a tokenizer from their GGUF headers
    before any weights load (`IncompatibleModelsError` names both).

    draft_slots: how many generations may draft at once, each on a KV sequence of its
    own in one draft model, their steps batched (`edgekit.runtime.DraftPool`); with one
    (the default) concurrent generations take turns on the draft, and each switch
    re-prefills it. `draft_model` may also be a `DraftPool`. draft_context: tokens per
    sequence; draft_threads: CPU threads of the draft (default: EDGEKIT_THREADS, or all).
    """

    def __init__(
        self,
        verifier: str | Sequence[str] | VerifierTransport | None = None,
        *,
        pair: str | None = None,
        draft: str | Path | DraftModel | DraftPool | None = None,
        target: str | Path | None = None,
        draft_model: str | Path | DraftModel | DraftPool | None = None,
        config: ClientConfig | None = None,
        generation: GenerationConfig | None = None,
        local_server: ServerConfig | None = None,
        draft_slots: int = 1,
        draft_context: int = 4096,
        draft_threads: int | None = None,
    ) -> None:
        if draft_slots < 1:
            raise ValueError("draft_slots must be at least 1")
        if draft is not None and draft_model is not None:
            raise ConfigError("name the draft once: draft= (draft_model= is its older name)")
        draft_model = draft if draft is not None else draft_model
        self.config = config or ClientConfig()
        if not self.config.client_id:  # one id for this client's sessions (the verifier's budgets follow it)
            self.config = replace(self.config, client_id=uuid.uuid4().hex)
        self.generation = generation or GenerationConfig()
        pair = pair or None  # "" is no pair named, as None
        self.pair = pair or DEFAULT_PAIR
        self._local: VerifierServer | None = None
        self._draft: DraftModel | None = None
        self._pool: DraftPool | None = None
        # Close only what this client made: a draft model or transport passed in
        # belongs to the caller.
        self._owns_draft = not hasattr(draft_model, "eval") and not isinstance(draft_model, DraftPool)
        where = ",".join(verifier) if isinstance(verifier, (list, tuple)) else verifier
        assert not isinstance(where, Sequence) or isinstance(where, str)
        if where is not None and target is not None:
            raise ConfigError("target= names the model of a local verifier; a verifier given serves its own")
        self._owns_transport = where is None or isinstance(where, str)
        transport: VerifierTransport | None = None
        try:
            if pair is None and draft_model is None and where is not None:  # the draft follows the verifier
                transport = where if not isinstance(where, str) else discovery_transport(where, self.config)
                self.pair, _ = discover_pair(transport)
            from ..models import get_pair
            from ..models.compat import require_pair

            name: str | None = None
            local_target: tuple[Path, str] | None = None
            source: str | Path | DraftModel | DraftPool
            if where is None:  # both files are known: their tokenizers are checked before any weights load
                spec = get_pair(self.pair)
                if draft_model is None or isinstance(draft_model, (str, Path)):
                    source, name = model_file(draft_model if draft_model is not None else spec.draft, "draft")
                    local_target = model_file(target if target is not None else spec.target, "target")
                    require_pair(source, local_target[0], draft_name=name, target_name=local_target[1])
                else:
                    source = draft_model
                    local_target = model_file(target if target is not None else spec.target, "target")
            else:  # by reference, the registry's when none is given
                source = draft_model if draft_model is not None else get_pair(self.pair).draft
                if isinstance(source, (str, Path)) and isinstance(where, str) and not needs_tokenizer(where):
                    # the draft's tokenizer against the verifier's target, before the draft's weights load
                    source, name = model_file(source, "draft")
                    transport = transport or discovery_transport(where, self.config)
                    check_remote_draft(transport, source, name)
            self._draft, self._pool = load_draft(source, draft_slots, draft_context, draft_threads, name=name)
            if where is None:
                self._local = start_local(self.pair, local_server, local_target)
                where = self._local.address
            if transport is None:
                transport = connect(where, self.config, self._draft) if isinstance(where, str) else where
            self.transport: VerifierTransport = transport
        except BaseException:
            if transport is not None and self._owns_transport and not hasattr(self, "transport"):
                transport.close()
            self.close()
            raise
        self._server: ServerInfo | None = None
        self._shared = SharedDraft(self.draft)  # the draft model serves one round at a time
        self._factory: ControllerFactory | None = None  # made at the handshake: it needs the target's name
        self.link = LinkEstimator()  # this device's view of its link to the verifier
        # What a round costs besides the link (draft step, verify line, acceptance), per mode, learnt
        # across generations: a policy then decides from the first round of the next one.
        self._costs: dict[str, CostTracker] = {}
        # Whether an "auto" generation drafts or streams the target's tokens: from what each cost here.
        self.routes = RouteChooser()
        self._expected = False  # whether `routes` was told the verifier's and the draft's step
        self._expecting = threading.Lock()

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
        slot = self._pool.acquire() if self._pool is not None else None
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
        workers = max(1, concurrency or (self._pool.slots if self._pool is not None else 1))
        pacing: dict[int, Phaser] = {}
        if plan is not None:
            tasks = sorted(k for b in plan.batches for k in b)
            if tasks != list(range(len(prompts))):
                raise ConfigError(f"the plan covers tasks {tasks}, not the {len(prompts)} prompts given")
            free = self._pool.free_slots() if self._pool is not None else 0
            if free < len(prompts):
                raise ConfigError(
                    f"a plan runs all {len(prompts)} tasks at once: it needs a draft slot each "
                    f"(EdgeClient(draft_slots={len(prompts) + 1})), {free} free"
                )
            overrides = {**overrides, "drafting": "fixed", "draft_k": plan.window}
            for batch in plan.batches:
                phaser = Phaser(len(batch))
                pacing.update({k: phaser for k in batch})
            workers = len(prompts)
            order = [k for b in plan.batches for k in b]  # started in the pipeline's order
        else:
            order = list(range(len(prompts)))

        def one(i: int) -> FinalStats | BaseException:
            phaser = pacing.get(i)
            try:
                controller = Paced(FixedWindow(plan.window), phaser) if plan and phaser else None
                return self.generate(prompts[i], controller=controller, **overrides).until_done()
            except Exception as exc:  # kept in its place; the others go on
                return exc
            finally:
                if phaser is not None:
                    phaser.leave()  # its batch-mates no longer wait for it

        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(prompts))), thread_name_prefix="edgekit") as ex:
            done = dict(zip(order, ex.map(one, order), strict=True))
        results = [done[i] for i in range(len(prompts))]
        if not return_exceptions:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

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
        chosen = controller is None and self._may_stream(gen)
        if chosen:
            if not self._expected:
                self._expect_routes(tokens, gen)
            # what a session would refuse (logprobs the verifier cannot give, say), refused whichever route
            check_supported(gen, self.server_info(), self.transport.address)
        route = self.routes.choose(gen.mode) if chosen else SPECULATIVE
        if route == STREAM:
            return GenerationStream(self._measured(gen, STREAM, self._streamed(tokens, gen, resume=True)))
        session = self._session(gen, controller)

        def events() -> Iterator[Event]:
            prefill_ms = session.open(tokens)
            yield from session.stream(prefill_ms=prefill_ms)

        measured = self._measured(gen, SPECULATIVE, events()) if chosen else events()
        return GenerationStream(measured, on_close=session.close)

    def generate_target_only(self, prompt: str | Sequence[int], **overrides: Any) -> GenerationStream:
        """The centralized baseline: the verifier's target decodes every token."""
        gen = self._config(overrides)
        self.server_info()
        return GenerationStream(self._streamed(self.tokenize(prompt), gen, resume=False))

    def _expect_routes(self, tokens: Sequence[int], gen: GenerationConfig) -> None:
        """Once, as `ClientConfig.first_route` says: by default, where the verifier says what a
        target step takes, a draft step is timed here (half of it where drafting overlaps the
        rounds, as `RouteChooser.observe` counts it), so that the first "auto" answer may stream
        where drafting could not be faster. A verifier out of reach raises here as the generation
        would; the next one asks again."""
        with self._expecting:
            if self._expected:
                return
            step_ms = self.server_info().decode_step_ms  # the handshake refuses a foreign tokenizer before a stream
            first = self.config.first_route
            if first == STREAM:
                self.routes.expect_dominated()
            elif first == "auto" and step_ms > 0 and tokens:
                draft_ms = self._shared.step_ms(tokens)
                self.routes.expect(step_ms, draft_ms / 2 if gen.proactive else draft_ms)
            self._expected = True

    @staticmethod
    def _may_stream(gen: GenerationConfig) -> bool:
        """Whether the verifier's target-only stream gives what this generation asks, under the
        "auto" policy: greedy decoding, or sampling without a seed (a seeded one is the same
        text every time only by the same route), ending at EOS (the stream always does)."""
        lossless = gen.mode == "greedy" or (gen.mode == "sample" and gen.seed is None)
        return gen.drafting == "auto" and gen.stream_when_faster and lossless and gen.stop_at_eos

    def _measured(self, gen: GenerationConfig, route: str, events: Iterator[Event]) -> Iterator[Event]:
        """`events`, their generation's speed counted for `route` once it ends (not when stopped),
        with what a draft token cost where it drafted."""
        for ev in events:
            if isinstance(ev, FinalStats) and ev.stats.finish_reason != "stopped":
                draft_ms = ev.stats.draft_ms_per_token if route == SPECULATIVE else None
                self.routes.observe(gen.mode, route, ev.stats.completion_tokens, ev.stats.elapsed_s, draft_ms,
                                    overlapped=gen.proactive)
            yield ev

    def _streamed(self, tokens: list[int], gen: GenerationConfig, *, resume: bool) -> Iterator[Event]:
        """The verifier's target-only stream as a generation's events. With `resume`, a stream the
        verifier stops answering goes on as a speculative session on the prompt and the tokens it
        delivered (which reopens and resumes through outages, `ClientConfig`), counted in the same
        figures, with a `Resumed` event where it switched."""
        seed = gen.seed if gen.seed is not None else secrets.randbits(63)
        stats = GenerationStats(
            mode=gen.mode, draft_k=0, drafting="target-only", sampler=gen.sampler().describe(),
            prompt_tokens=len(tokens),
        )
        progress = StatsAccumulator(stats, TextDecoder(self.draft))
        finish = None
        try:
            for t in self.transport.generate(
                tokens,
                mode=gen.mode,
                sampler=gen.sampler(),
                seed=seed,
                max_tokens=gen.max_tokens,
                slo=SpeedObjective(gen.slo_class, gen.target_speed),
                logprobs=-1 if gen.logprobs is None else gen.logprobs,
            ):
                progress.add_target_token(t.decode_ms)
                yield progress.output([t.token], (t.logprobs,) if t.logprobs is not None else ())
                finish = t.finish_reason or finish
        except VerifierUnavailableError as exc:
            if not resume:
                raise
            finish = yield from self._resumed(tokens, gen, progress, exc)
        tail = progress.flush()
        if tail is not None:  # streamed, as a session's stream does
            yield tail
        yield progress.finish(finish)

    def _resumed(self, tokens: list[int], gen: GenerationConfig, progress: StatsAccumulator,
                 cause: Exception) -> Generator[Event, None, str | None]:
        """The rest of a stream cut off by `cause`, drafted and verified in a session of its own;
        returns its finish reason."""
        start = time.perf_counter()
        left = gen.max_tokens - len(progress.token_ids)
        if left <= 0:
            return "length"
        session = self._session(replace(gen, max_tokens=left))
        try:
            def open_it() -> Generator[Provisional, None, float]:
                # the stream's tokens were the target's steps: the verifier rebuilds them as rounds
                history = (ContextSpan(len(tokens)), ContextSpan(len(progress.token_ids), generated=True))
                return session.open(tokens + progress.token_ids, history if progress.token_ids else ())
                yield  # a generator: through_outages runs attempts that may yield

            def sleep(delay: float) -> Iterator[Provisional]:
                time.sleep(delay)
                yield from ()

            # the verifier may still be away: open the session with back-off, as a round would be
            prefill_ms, outage = yield from through_outages(open_it, self.config, reopen=lambda: 0, between=sleep)
            causes = (type(cause).__name__, *(outage.causes if outage is not None else ()))
            resumed = Resumed((time.perf_counter() - start) * 1e3, (outage.attempts if outage is not None else 0) + 1,
                              len(tokens) + len(progress.token_ids), tuple(dict.fromkeys(causes)))
            progress.add(resumed)
            yield resumed
            finish = None
            for ev in session.stream(prefill_ms=prefill_ms):
                if isinstance(ev, TextDelta):
                    if ev.token_ids:
                        yield progress.output(list(ev.token_ids), ev.logprobs)
                elif isinstance(ev, FinalStats):
                    finish = ev.stats.finish_reason
                else:
                    if isinstance(ev, (RoundEvent, Resumed)):
                        progress.add(ev)
                    yield ev
            return finish
        finally:
            session.close()

    def close(self) -> None:
        transport = getattr(self, "transport", None)
        if transport is not None and self._owns_transport:
            transport.close()
        if self._local is not None:
            self._local.stop()
            self._local = None
        if self._pool is not None:
            if self._owns_draft:
                self._pool.close()
            elif isinstance(self._draft, DraftSlot):
                self._draft.close()  # the caller's pool: its slot given back
        elif self._draft is not None and self._owns_draft and hasattr(self._draft, "close"):
            self._draft.close()
        self._draft = None
        self._pool = None

    def __enter__(self) -> EdgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
