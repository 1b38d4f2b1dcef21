"""Configuration as dataclasses; every default lives here.

Environment overrides are named EDGEKIT_* and are read by `from_env()` only,
so constructing a config in code is never surprised by the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from .errors import ConfigError
from .protocol import Sampler
from .registry import BUDGET_POLICIES, DRAFTING, ENGINES, SCHEDULERS

__all__ = ["DEFAULT_SLO_CLASSES", "ClientConfig", "GenerationConfig", "ServerConfig"]

Mode = Literal["greedy", "sample", "semantic"]
Upload = Literal["tokens", "fh", "sh", "auto", "rtt"]
HiddenEncoding = Literal["fp16", "int8"]
Numerics = Literal["exact", "fast"]
Calibrate = Literal["auto", "force", "off"]
OnDisconnect = Literal["draft", "wait", "fail"]
FirstRoute = Literal["auto", "speculative", "target-only"]

MAX_STOPS = 64  # stop strings, and stop tokens, one generation may name (OpenAI's API takes 4)

# Token-speed SLO classes a verifier serves by default: WISP's four (sec. 5.1), tokens/s.
DEFAULT_SLO_CLASSES: Mapping[str, float] = {"realtime": 8.0, "interactive": 6.0, "standard": 4.0, "relaxed": 2.0}


@dataclass(frozen=True)
class GenerationConfig:
    """How one generation decodes."""

    max_tokens: int = 256
    # "greedy" and "sample" are lossless. "semantic" (WISV, lossy, opt-in) drafts greedily and
    # lets the verifier's decision head accept mismatches it judges harmless, more readily on a
    # poor link; it needs hidden-state uploads (upload fh, sh, auto or rtt) and a verifier
    # with a head (`edgekit serve --semantic-head`).
    mode: Mode = "greedy"
    # Semantic mode: a mismatch is rejected when the head's P(reject) exceeds this (0: every
    # mismatch rejected, as greedy; 1: none). None: the head's own operating threshold.
    semantic_threshold: float | None = None
    temperature: float = 0.8
    # The sampler past the temperature (`edgekit.Sampler` says what each does, and in which
    # order): applied to the target's logits on the verifier and to the draft's on the device,
    # so sampling stays exactly the target's with these settings. top_k 0, top_p 1, min_p 0:
    # no truncation. Penalties count the last penalty_last_n tokens (-1: the whole context, 0:
    # none), the prompt's among them, as llama.cpp and Ollama do. The penalties and the bias
    # apply to greedy decoding too (its argmax is taken after them).
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit
    # The target's log-probability of each output token (raw: before the sampler), with this many
    # likeliest alternatives (0-20), as the verifier computes them; None: not asked (they cost it
    # a pass over the vocabulary per token). In each TextDelta and in FinalStats.
    logprobs: int | None = None
    # The draft may sample at its own temperature: speculative sampling stays
    # lossless for any draft distribution, only acceptance changes. None: same.
    draft_temperature: float | None = None
    seed: int | None = None
    # How long each round's block is: "fixed" drafts draft_k tokens; "predictor"
    # stops at the first rejection an ONNX predictor foresees (WISP), "p-min" where
    # the draft's top probability falls below p_min (llama.cpp's draft p-min),
    # both within max_window; "latency" drafts the window (up to max_window) that
    # the latency model expects to be fastest per committed token on the measured
    # link; "auto" is "predictor" when one is shipped for this draft and target
    # (or given) and onnxruntime is installed, else "fixed".
    drafting: str = "auto"  # a name in edgekit.registry.DRAFTING
    draft_k: int = 4  # fixed draft window (SLED-style baseline)
    max_window: int = 8  # bound of the adaptive policies (the shipped predictors saw blocks of up to 8)
    predictor: str | None = None  # an ONNX predictor file; None: the one shipped for the pair
    predictor_threshold: float | None = None  # None: the predictor's own operating threshold
    # With drafting "predictor" or "auto" and no predictor_threshold: where the predictor's card
    # has a delay schedule, the threshold, stop rule and largest block follow what a round costs
    # (the measured RTT and verifier time, in draft steps) rather than one operating point.
    predictor_schedule: bool = True
    p_min: float = 0.5
    draft_top_k: int = 32  # support of the uploaded draft distribution when sampling
    # Draft hidden states to the verifier (WISV): "tokens" sends none; "fh" every
    # row with the block; "sh" only the rows the verifier asks for (its
    # mismatches), one more exchange; "auto" picks FH or SH each round by the
    # latency model; "rtt" is WISV's fixed rule (FH when RTT > rtt_rule_ms).
    # Only the semantic mode reads them; in the lossless modes they cost link
    # time and change nothing in the output.
    upload: Upload = "tokens"
    hidden_encoding: HiddenEncoding = "fp16"
    rtt_rule_ms: float = 10.0
    stop_at_eos: bool = True
    # Stop strings: the output ends before the first one its text holds (finish reason "stop"),
    # the string itself not in it; text that may begin one is held back until it cannot. Stop
    # tokens: token ids that end the output as an end of text does (the last token, its text
    # not shown; finish reason "stop"), sent to the verifier for its target-only stream.
    stop: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()
    # Proactive drafting: while a block is being verified, draft the next one as if all of it
    # will be accepted (starting from the draft's own guess of the verifier's token). A verdict
    # that accepts the whole block with that token starts the next round at once; any other
    # drops what was drafted ahead. Lossless either way; counted in the stats.
    proactive: bool = False
    # With drafting "latency" or "auto": no draft (plain target decoding, one round trip and one
    # target step per token) while the latency model expects that to be faster than any window,
    # with a short block now and then to see whether drafting pays again. Lossless either way.
    plain_when_faster: bool = True
    # With drafting "auto": a generation may be the verifier's target-only stream (one round trip,
    # then the target's pace) where this client measured that faster than drafting; the first
    # generation of a mode drafts, the next streams, then the faster is kept (and the other
    # tried now and then). Lossless either way. Greedy, and sampling without a seed (a seeded
    # one keeps its route, so that it gives the same text every time); `EdgeClient.generate`
    # only: a conversation keeps its session.
    stream_when_faster: bool = True
    # A token-speed SLO for the verifier to schedule by (protocol 2): a class it
    # names (its handshake lists them; WISP's four by default: realtime 8,
    # interactive 6, standard 4, relaxed 2 tokens/s), or a speed, which wins.
    # Neither: best effort.
    slo_class: str | None = None
    target_speed: float | None = None  # tokens/s

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {self.max_tokens}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if len(stop) > MAX_STOPS or not all(isinstance(x, str) and x for x in stop):
            raise ConfigError(f"stop takes up to {MAX_STOPS} strings, none of them empty, got {self.stop!r}")
        stop_tokens = tuple(self.stop_tokens)
        if len(stop_tokens) > MAX_STOPS or not all(isinstance(t, int) and t >= 0 for t in stop_tokens):
            raise ConfigError(f"stop_tokens takes up to {MAX_STOPS} token ids, got {self.stop_tokens!r}")
        object.__setattr__(self, "stop", stop)  # a list given is kept as a tuple: the config stays hashable
        object.__setattr__(self, "stop_tokens", stop_tokens)
        if self.mode not in ("greedy", "sample", "semantic"):
            raise ConfigError(f"mode must be 'greedy', 'sample' or 'semantic', got {self.mode!r}")
        if self.semantic_threshold is not None and not (
            math.isfinite(self.semantic_threshold) and 0.0 <= self.semantic_threshold <= 1.0
        ):
            raise ConfigError(f"semantic_threshold must be between 0 and 1, got {self.semantic_threshold}")
        if self.semantic_threshold is not None and self.mode != "semantic":
            raise ConfigError(f"semantic_threshold is read in semantic mode only; the mode is {self.mode!r}")
        if self.mode == "semantic" and self.upload == "tokens":
            raise ConfigError(
                "semantic mode reads the draft's hidden states at mismatches: set upload to fh, sh, auto or rtt "
                "(upload='tokens' sends none)"
            )
        for name in ("temperature", "draft_temperature"):  # in any mode: greedy reads neither, but a NaN is a mistake
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.draft_temperature is not None and not self.draft_temperature > 0:
            raise ConfigError(f"draft_temperature must be > 0, got {self.draft_temperature}")
        if self.mode == "sample" and not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 when sampling, got {self.temperature}")
        try:
            sampler = self._build_sampler()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        draft = sampler
        if self.mode == "sample" and self.draft_temperature is not None:
            draft = replace(sampler, temperature=self.draft_temperature)
        object.__setattr__(self, "_samplers", (sampler, draft))  # built once: the draft asks every token
        if self.mode == "semantic" and sampler.adjusts:
            raise ConfigError(
                "semantic mode judges the target's plain top-1 token: it takes no penalties or logit_bias"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ConfigError(f"logprobs must be between 0 and 20 alternatives, got {self.logprobs}")
        if not 1 <= self.draft_k <= 64:
            raise ConfigError(f"draft_k must be between 1 and 64, got {self.draft_k}")
        DRAFTING.check(self.drafting)
        if self.upload not in ("tokens", "fh", "sh", "auto", "rtt"):
            raise ConfigError(f"upload must be tokens, fh, sh, auto or rtt, got {self.upload!r}")
        if self.hidden_encoding not in ("fp16", "int8"):
            raise ConfigError(f"hidden_encoding must be fp16 or int8, got {self.hidden_encoding!r}")
        if not self.rtt_rule_ms >= 0:
            raise ConfigError(f"rtt_rule_ms must be >= 0, got {self.rtt_rule_ms}")
        if not 1 <= self.max_window <= 64:
            raise ConfigError(f"max_window must be between 1 and 64, got {self.max_window}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ConfigError(f"p_min must be between 0 and 1, got {self.p_min}")
        if self.predictor_threshold is not None and not 0.0 <= self.predictor_threshold <= 1.0:
            raise ConfigError(f"predictor_threshold must be between 0 and 1, got {self.predictor_threshold}")
        if not 1 <= self.draft_top_k <= 1024:
            raise ConfigError(f"draft_top_k must be between 1 and 1024, got {self.draft_top_k}")
        if self.slo_class is not None and not self.slo_class.strip():
            raise ConfigError("slo_class must name a class, or be None for best effort")
        if self.target_speed is not None and not (math.isfinite(self.target_speed) and self.target_speed > 0):
            raise ConfigError(f"target_speed must be a positive number of tokens/s, got {self.target_speed}")

    def sampler(self) -> Sampler:
        """The target's sampler: temperature 0 (greedy) unless the mode samples."""
        return self._samplers[0]  # type: ignore[attr-defined]

    def draft_sampler(self) -> Sampler:
        """The draft's: the target's, at the draft's own temperature where one is set."""
        return self._samplers[1]  # type: ignore[attr-defined]

    def _build_sampler(self) -> Sampler:
        return Sampler(
            temperature=self.temperature if self.mode == "sample" else 0.0,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            penalty_last_n=self.penalty_last_n,
            logit_bias=tuple((self.logit_bias or {}).items()),
        )


@dataclass(frozen=True)
class ClientConfig:
    """How the client reaches a verifier."""

    timeout: float = 30.0  # deadline of every verifier call, seconds
    connect_timeout: float = 10.0  # deadline for the channel to become ready
    token: str | None = None  # sent as `authorization: Bearer <token>`
    tls: bool = False
    # A token is sent in plaintext only to a verifier on this machine (a loopback address or
    # localhost): to any other over plain gRPC or HTTP the connection is refused, as anyone on the
    # path could read the token, unless this is True (EDGEKIT_INSECURE, --insecure): a private
    # link the user trusts, a tunnel, a TLS-terminating proxy on the same host under another name.
    insecure: bool = False
    root_certificates: str | None = None  # PEM file; system roots when None
    # Mutual TLS: this client's certificate chain and private key (PEM files), for a verifier
    # that asks for one (`edgekit serve --tls-client-ca`).
    tls_cert: str | None = None
    tls_key: str | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    # A generation that loses its verifier (unreachable, a deadline, a full queue, a session
    # the verifier no longer knows) tries again for this long in all, backing off exponentially
    # from retry_initial to retry_max seconds with jitter, then reopens its session from the
    # committed tokens where needed and goes on. 0: fail at the first loss.
    retry_for: float = 60.0  # long enough for a 30 s outage (a restart, a lift, a tunnel)
    retry_initial: float = 0.2
    retry_max: float = 2.0  # as gRPC's own reconnect back-off: a link that is back is found within ~2 s
    # While no verifier answers (a round has had no verdict for draft_ahead_after seconds, or
    # failed): "draft" keeps drafting ahead, up to max_provisional tokens, streamed as
    # `Provisional` events and sent as blocks when a verifier answers again (the accepted
    # prefix is kept: lossless); "wait" only tries again; "fail" gives up at the first loss.
    # "wait" by default: measured through 1-30 s outages on the gemma pair, drafting ahead
    # did not shorten answers beyond the retries' jitter and 60 of 64 provisional tokens were
    # replaced (a single greedy path rarely survives past its first uncertain token), and it
    # puts each verify call on a thread of its own. "draft" is for apps that would rather
    # show the draft's continuation than nothing (docs/guides/outages-and-auth.md).
    on_disconnect: OnDisconnect = "wait"
    draft_ahead_after: float = 1.0
    max_provisional: int = 64
    # Sent with each session opened, so a verifier that assigns draft budgets carries this
    # client's acceptance and goodput estimates from one session to the next. "": a random
    # id per EdgeClient (nothing stable leaves the device unless this is set).
    client_id: str = ""
    # How this client's first "auto" answer of a mode goes, before either way was measured
    # (`edgekit.client.RouteChooser`): "auto" streams it where the verifier says its target steps
    # faster than a draft step timed here (`ServerInfo.decode_step_ms`), else drafts it;
    # "speculative" drafts it; "target-only" streams it and takes drafting as dominated, tried
    # only after `max_explore_every` answers. Later answers go by what each way was measured to
    # cost. Where the two steps are close, the machine's timing decides "auto" run by run: tests
    # and benchmarks that need one route pin it here. EDGEKIT_FIRST_ROUTE, where set, is the first
    # route of every EdgeClient whose config leaves it "auto" (`from_env` reads it too).
    first_route: FirstRoute = "auto"
    # Over gRPC, True sends a session's rounds on one stream (the Rounds RPC) where the verifier
    # offers it; False (the default), a Verify call each. Measured on one verifier core, a stream
    # per session gave 0.7-1.45x the rounds per second of Verify calls and, past 256 devices at
    # saturation, a tail ten times longer (p99 7-8 s at 1,024 devices, against 0.8-1 s): open streams
    # went round after round while the devices opening one waited seconds for gRPC to take the new
    # call (docs/results/serving-stack.md).
    round_streams: bool = False

    def __post_init__(self) -> None:
        if not (self.timeout > 0 and self.connect_timeout > 0):
            raise ConfigError("timeout and connect_timeout must be positive")
        if not (self.retry_for >= 0 and 0 < self.retry_initial <= self.retry_max):
            raise ConfigError("retry_for must be >= 0 and 0 < retry_initial <= retry_max")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("a client certificate needs both tls_cert and tls_key")
        if self.on_disconnect not in ("draft", "wait", "fail"):
            raise ConfigError(f"on_disconnect must be draft, wait or fail, got {self.on_disconnect!r}")
        if not (self.draft_ahead_after > 0 and 0 <= self.max_provisional <= 4096):
            raise ConfigError("draft_ahead_after must be positive and max_provisional between 0 and 4096")
        if len(self.client_id) > 256:
            raise ConfigError(f"client_id must be at most 256 characters, got {len(self.client_id)}")
        if self.first_route not in get_args(FirstRoute):
            raise ConfigError(f"first_route must be auto, speculative or target-only, got {self.first_route!r}")

    @classmethod
    def from_env(cls, **overrides: Any) -> ClientConfig:
        """The defaults, then the EDGEKIT_* variables set, then `overrides` (a caller's explicit
        values, such as a command's flags, win over the environment)."""
        return replace(cls(), **{**_env_values(cls, "EDGEKIT_"), **overrides})


@dataclass(frozen=True)
class ServerConfig:
    """Limits and resources of the reference verifier."""

    host: str = "127.0.0.1"
    port: int = 50551  # 0 picks a free port
    max_sessions: int = 16
    # Sessions whose KV the engine's context holds at once (0: all of max_sessions, up to the 256
    # sequences a llama.cpp context holds); the others are parked, their KV copied to host memory
    # and loaded back when they next call. KV memory in the context is max_context x this.
    resident_sessions: int = 0
    max_block: int = 32  # draft tokens per round
    max_context: int = 4096  # tokens per session; KV memory is max_context x max_sessions (x frontends)
    idle_timeout: float = 900.0  # seconds before an idle session may be evicted
    # With the table full, a session idle this long makes room for a new one (least recently used first).
    reclaim_after: float = 60.0
    # The most sessions one client (a tenant of the tokens file, else a peer host) may hold; 0: no
    # hard limit. Either way, with the table full, a client holding less than half of it takes the
    # least recently used session of one holding more (its owner reopens it when it next calls).
    max_sessions_per_client: int = 0
    # Proxies in front (addresses or networks, comma-separated): from these a call's host is the last
    # address of its x-forwarded-for, so that devices behind them count as clients of their own.
    trusted_proxies: str = ""
    max_draft_top_k: int = 1024
    max_message_bytes: int = 16 * 1024 * 1024
    max_generate_tokens: int = 4096
    token: str | None = None  # require `authorization: Bearer <token>`: one secret, shared
    tokens_file: str | None = None  # several tokens, one tenant each: lines of `NAME TOKEN`
    tls_cert: str | None = None
    tls_key: str | None = None
    # Mutual TLS: clients must present a certificate signed by this CA (PEM file).
    tls_client_ca: str | None = None
    threads: int | None = None
    # Target layers on a GPU, where llama.cpp was built with one: -1 all, 0 none; None:
    # EDGEKIT_GPU_LAYERS, else llama.cpp's default (all). A CPU-only build ignores it.
    gpu_layers: int | None = None
    workers: int = 32  # gRPC handler threads for unary calls (at least max_sessions + 8)
    # Streams (a session's Rounds, a target-only Generate) open at once, each holding a thread of its
    # own beside the workers (0: max_sessions); past it, and past max_sessions_per_client of one
    # client's, a new stream is refused (RESOURCE_EXHAUSTED). A stream that moves no message for
    # stream_idle_timeout seconds while the verifier is not working on it is ended (a device opens
    # another at its next round): a client cannot hold threads by opening streams and sending nothing.
    max_streams: int = 0
    stream_idle_timeout: float = 60.0
    # Calls in flight or waiting for a thread at once (gRPC's maximum_concurrent_rpcs; 0: four per
    # thread); past it a call is refused (RESOURCE_EXHAUSTED) before anything of it is read.
    max_calls: int = 0
    # A connection with no call for this long is closed (the client reconnects at its next call).
    connection_idle_timeout: float = 600.0
    # The most bytes a Ping may ask to be answered with (the link probe's downlink payload).
    max_ping_reply_bytes: int = 4 * 1024 * 1024
    # What runs the target a VerifierServer is given by name (a GGUF file's path, say): a kind in
    # edgekit.registry.ENGINES ("llama": llama.cpp), or one a package adds by entry point.
    engine: str = "llama"
    # Verifier processes serving `port` (`edgekit.verifier.FrontEnds`): each its own gRPC server,
    # sessions (max_sessions each, its limits its own), scheduler and acceptance, all over one engine in the main
    # process (`EngineHost`), which runs what they send while it is busy in one batch. The kernel
    # spreads the devices' connections over them (SO_REUSEPORT); front end i serves metrics on
    # metrics_port + i (0: each on a free port). One process's Python caps it at 1,200-1,700 rounds a second.
    frontends: int = 1
    # "exact": greedy output token-identical to target-only decoding (slower
    # kernels, blocks in batch-invariant sub-batches); "fast": every kernel.
    numerics: Numerics = "exact"
    # Where a greedy round's rows become best ids: "host" (whole rows out of llama.cpp, one argmax
    # per call) or "llama" (llama.cpp's backend sampling takes each row's argmax where the row is
    # made: on a GPU no vocabulary-wide row comes back; not yet measured on one).
    reduce_rows: Literal["host", "llama"] = "host"
    # Prompts and turns longer than this go to the engine in chunks, other sessions'
    # rounds between them: the longest a prefill holds the engine is one chunk.
    prefill_chunk: int = 128
    # The most rows (tokens) one engine batch puts through: the scheduler cuts batches there, the
    # oldest work always going (vLLM's max_num_batched_tokens). A GPU target wants every waiting
    # round in one step (128 devices x 5 rows: 640); a CPU one gains little past a few hundred.
    max_batch_rows: int = 2048
    # Which work the engine runs next: "fcfs" (arrival order, SLED's verifier) or
    # "wisp" (WISP's Algorithm 1: deadlines first, then expected tokens per ms).
    policy: str = "fcfs"  # a name in edgekit.registry.SCHEDULERS
    # Named token-speed classes, tokens/s; a mapping, or "name=speed,..." (for the environment).
    slo_classes: Mapping[str, float] | str = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    guard_ms: float = 20.0  # wisp: the guard time delta of the latest start time (eq. 17)
    # A round's budget: "round" is WISP eq. 6 (this block's expected tokens at the
    # session's speed); "response" what keeps the whole response at its speed.
    slo_budget: Literal["round", "response"] = "round"
    starvation_s: float = 2.0  # wisp: the longest any work waits before it goes first, best effort included
    # wisp: while less than this share of a batch's predicted time is work (not the per-batch
    # constant), deadlines do not stop it growing (0: Algorithm 1 as published, whose small
    # batches halved goodput past ~150 devices in the GPU-scale simulation).
    min_efficiency: float = 0.75
    # wisp: a session more than this share of whose recent rounds went to the engine too late
    # to meet their deadlines (under overload: out of reach) goes after every reachable one
    # until its rounds go in time again (1: Algorithm 1's order, late work first always).
    unreachable_share: float = 0.9
    max_queue: int = 256  # works waiting for the engine before new ones are refused (RESOURCE_EXHAUSTED)
    # Draft budgets the verifier assigns each session (`next_budget`): "goodspeed" (GOODSPEED's
    # gradient scheduling, eq. 5, log utility), its baselines "fixed" (C/N each) and "random", or
    # "none" (devices choose). A block longer than its budget is cut to it.
    budgets: str = "none"  # a name in edgekit.registry.BUDGET_POLICIES
    token_budget: int = 0  # C, draft tokens per target pass over all sessions; 0: from the estimator and SLOs
    # Smoothing of each client's acceptance estimate (eq. 3): 0.05 tracked a change of prompt kind as
    # well as 0.1 and with less noise in benchmarks/budget_smoothing.py (gemma traces, blocks of 4),
    # and gave a higher utility than 0.2 in every configuration of `goodspeed.py sweep`.
    budget_eta: float = 0.05
    # Smoothing of each client's goodput estimate (eq. 4). GOODSPEED ran 0.5; in `goodspeed.py sweep`
    # (8 seeds, 4 and 8 devices, kinds switching, with and without weaker drafts) 0.5 gave the lowest
    # utility of 0.5/0.2/0.1/0.05 everywhere: the budgets chase each round's luck and, x_hat being
    # concave in S, swinging budgets commit less than steady ones. 0.1 was best or within 0.02 of it.
    budget_beta: float = 0.1
    # The verification-time estimator's calibration: "auto" uses the cached one for this
    # model and machine, measuring it first when the policy needs it; "force" measures
    # again; "off" never measures (the estimator learns from the live batches only). The exact
    # numerics' batch table (which sub-batches stay bit-exact, by depth) is kept in the same
    # directory; it is always measured when none is kept ("force" measures it again too).
    # Without a calibration, "auto" and "force" also time a few target steps before serving,
    # for the handshake's `decode_step_ms`; "off" does not.
    calibrate: Calibrate = "auto"
    calibration_dir: str | None = None  # None: $XDG_CACHE_HOME/edgekit/calibration or ~/.cache/...
    # Serve Prometheus metrics over HTTP on this port of `host` (0 picks a free port); None: no
    # endpoint. Needs prometheus-client: pip install 'edgekit[server]'.
    metrics_port: int | None = None
    # The address the metrics endpoint listens on: loopback unless asked (it has no auth, and tells
    # the load, sessions and tenants of the verifier); 0.0.0.0 for a scraper on another host.
    metrics_host: str = "127.0.0.1"
    # Semantic verification (WISV, lossy, opt-in per session): the ONNX decision head the
    # verifier runs; None or "" offers no semantic mode. `edgekit serve --semantic-head shipped`
    # names the head shipped for the pair. A local verifier (`EdgeClient(pair=...)`) loads the
    # pair's shipped head where this is None; "" keeps it off there too.
    semantic_head: str | None = None

    def __post_init__(self) -> None:
        if self.max_sessions < 1 or self.max_block < 1 or self.max_context < 8:
            raise ConfigError("max_sessions and max_block must be >= 1, max_context >= 8")
        if self.prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be at least 1, got {self.prefill_chunk}")
        if self.resident_sessions < 0:
            raise ConfigError(
                f"resident_sessions must be >= 0 (0: as many as max_sessions), got {self.resident_sessions}"
            )
        if self.max_batch_rows < 1:
            raise ConfigError(f"max_batch_rows must be at least 1, got {self.max_batch_rows}")
        if self.frontends < 1:
            raise ConfigError(f"frontends must be at least 1, got {self.frontends}")
        if self.numerics not in ("exact", "fast"):
            raise ConfigError(f"numerics must be 'exact' or 'fast', got {self.numerics!r}")
        if self.reduce_rows not in ("host", "llama"):
            raise ConfigError(f"reduce_rows must be host or llama, got {self.reduce_rows!r}")
        SCHEDULERS.check(self.policy)
        ENGINES.check(self.engine)
        if self.slo_budget not in ("round", "response"):
            raise ConfigError(f"slo_budget must be 'round' or 'response', got {self.slo_budget!r}")
        if self.calibrate not in ("auto", "force", "off"):
            raise ConfigError(f"calibrate must be auto, force or off, got {self.calibrate!r}")
        if not (self.guard_ms >= 0 and self.starvation_s > 0 and self.max_queue >= 1):
            raise ConfigError("guard_ms must be >= 0, starvation_s > 0 and max_queue >= 1")
        BUDGET_POLICIES.check(self.budgets)
        if self.token_budget < 0 or not (0 < self.budget_eta <= 1 and 0 < self.budget_beta <= 1):
            raise ConfigError("token_budget must be >= 0, budget_eta and budget_beta in (0, 1]")
        if not 0 <= self.min_efficiency < 1:
            raise ConfigError(f"min_efficiency must be in [0, 1), got {self.min_efficiency}")
        if not 0 < self.unreachable_share <= 1:
            raise ConfigError(f"unreachable_share must be in (0, 1], got {self.unreachable_share}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be a port number (0 for a free one), got {self.metrics_port}")
        if self.max_streams < 0 or self.max_calls < 0 or self.max_ping_reply_bytes < 0:
            raise ConfigError("max_streams, max_calls and max_ping_reply_bytes must be >= 0")
        if not (self.stream_idle_timeout > 0 and self.connection_idle_timeout > 0):
            raise ConfigError("stream_idle_timeout and connection_idle_timeout must be positive")
        if self.reclaim_after < 0 or self.max_sessions_per_client < 0:
            raise ConfigError("reclaim_after and max_sessions_per_client must be >= 0")
        object.__setattr__(self, "slo_classes", _slo_classes(self.slo_classes))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both a certificate and a key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("mutual TLS (tls_client_ca) needs the server's own certificate and key")

    @classmethod
    def from_env(cls, **overrides: Any) -> ServerConfig:
        """The defaults, then the EDGEKIT_SERVE_* variables set, then `overrides`."""
        return replace(cls(), **{**_env_values(cls, "EDGEKIT_SERVE_"), **overrides})


def _slo_classes(spec: Mapping[str, float] | str) -> dict[str, float]:
    """Named classes from a mapping or from "name=speed,name=speed"; speeds must be positive."""
    if isinstance(spec, str):
        items: list[tuple[str, Any]] = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, speed = part.partition("=")
            if not sep:
                raise ConfigError(f"SLO class {part!r}: write name=tokens_per_s, e.g. realtime=8")
            items.append((name.strip(), speed.strip()))
    else:
        items = list(spec.items())
    out: dict[str, float] = {}
    for name, speed in items:
        try:
            value = float(speed)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO class {name!r}: {speed!r} is not a speed in tokens/s") from None
        if not name or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"SLO class {name!r}: a class needs a name and a positive speed, got {speed!r}")
        out[name] = value
    return out


def _env_values(cls: type, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    defaults = cls()
    for f in fields(cls):
        raw = os.environ.get(prefix + f.name.upper())
        if raw is None:
            continue
        default = getattr(defaults, f.name)
        # An optional number (None by default) is read as the number it is when set.
        kind = type(default) if default is not None else {"int | None": int, "float | None": float}.get(str(f.type))
        try:
            if kind is bool:
                out[f.name] = raw.lower() in ("1", "true", "yes", "on")
            elif kind is int:
                out[f.name] = int(raw)
            elif kind is float:
                out[f.name] = float(raw)
            else:
                out[f.name] = raw
        except ValueError as exc:
            what = kind.__name__ if kind is not None else type(default).__name__
            raise ConfigError(f"{prefix}{f.name.upper()}={raw!r} is not a valid {what}") from exc
    return out
