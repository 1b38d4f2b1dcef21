"""The load generator of `serve_load.py`: many devices in a few lean processes.

Devices are spread over worker processes, one per core it is given, each pinned
to its core. A worker runs its devices as coroutines of one asyncio loop over
grpc.aio (`mode="aio"`), or as one thread each over gRPC's blocking stubs
(`mode="threads"`, for comparison). A device speaks edgekit.verifier.v1 with the
project's protobuf messages directly, none of the client's machinery between it
and the wire: a handshake, then sessions one after another, each opened with a
prompt, verify rounds back to back (every one naming its base position) until
`tokens` tokens are committed, and closed. Every device has a channel (a
connection) of its own, as real devices do, unless `channels="worker"`.

Drafting is a table lookup. The toy target and its noisy draft (`ToyLanguageModel`)
depend on a context's last `order` tokens only, so every prompt's greedy target
continuation, the draft's block at each position of it and what greedy
verification must answer there are computed once, before the clock starts
(`Tables`): an instant device costs its process one protobuf message and one
call a round. With `Workload.traces` the tables are a real pair's recorded drafting
instead (`fleet_sim`'s traces: the real target's greedy output, the real draft's block
at each position), for a target that answers as the recorded one did (`replayed.py`),
and a device's blocks may be cut by the pair's rejection predictor
(`drafting="predictor"`). Either way a device may draft the budgets the verifier
assigns (`follow_budgets`), hold an SLO class (`slo`), wait a round trip
(`rtt_min_ms`..`rtt_max_ms`) before each call, or ask target-only Generate streams
instead of drafting (`generate`). A paced device (`draft_ms`, per draft token) waits
that long before each round, as a device that drafts on its own hardware would. Every
verdict is checked against the table: accepted count, correction or bonus token
and committed length must be what the target's greedy decoding gives; a
mismatch ends the session and is counted (there must be none).

A worker counts the rounds that finish inside the measuring window `[start, end]`
(`time.monotonic`, one clock for every process on Linux), their round trips and
the server's timings they carry, and every error and mismatch whenever it happens.

The instant verifier (`python -m benchmarks.rigs.loadgen instant`) answers every round at once,
correctly, from the same tables, on a gRPC server built as the verifier's is: the
generator against it drives what gRPC alone allows, without the verifier's own cost.

Asyncio or threads: against the instant verifier at 64 devices (2-core VM, one
core each side), a round cost a worker 346-355 us of CPU on asyncio and 377-399
us on threads (a channel per device or one per worker), as cheap within the
noise; asyncio is the default, one thread then serving a thousand devices. Either
way gRPC's own code takes most of it (py-spy: the device's own code ~5%).

Processes talk over their stdin and stdout in JSON lines (`LineProcess`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.fleet_sim import draft_block, load_traces
from edgekit.config import DEFAULT_SLO_CLASSES as SLO_CLASSES
from edgekit.protocol import GREEDY, PROTOCOL_VERSION, SERVICE_NAME, fingerprint_to_pb, pb, sampling_to_pb
from edgekit.runtime import ToyLanguageModel
from edgekit.transport import CLIENT_HEADER

__all__ = ["LineProcess", "MemoToyLM", "Tables", "Workload", "cpu_seconds", "parse_cores", "prepare_process", "spawn",
           "toy_target"]


# -- the toy pair and its tables -------------------------------------------------------------


class MemoToyLM(ToyLanguageModel):
    """A toy LM whose logits are computed once per context: they depend on the last `order`
    tokens only, so a row is a dict lookup after the first time (a verifier over it costs
    its engine next to nothing, and the tables below build in a fraction of a second)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._memo: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context[-self.order :])
        row = self._memo.get(key)
        if row is None:
            row = self._memo[key] = super().logits(context)
            row.flags.writeable = False  # shared by every caller
        return row


@dataclass(frozen=True)
class Workload:
    """What the devices do, and the toy pair they do it with."""

    vocab: int = 64
    seed: int = 0
    noise: float = 0.4  # the draft's noise: at vocab 64, about 0.6 of draft tokens accepted (greedy, K = 4)
    k: int = 4  # draft tokens a round
    prompt_len: int = 16
    tokens: int = 128  # tokens committed before a session is closed and the next opened
    prompts: int = 64
    draft_ms: float = 0.0  # per draft token; 0: instant devices
    # Recorded drafting instead of the toy pair (benchmarks/rigs/fleet_sim.py's traces JSON): its
    # prompts, the real target's greedy output and the real draft's blocks; vocab, noise,
    # prompt_len, tokens and prompts are then the traces'. `tokenizer`: a GGUF whose vocabulary is
    # the devices' fingerprint (the target served; default: the traces' draft in the model cache).
    traces: str = ""
    tokenizer: str = ""
    # Devices that draft nothing: each session is one target-only Generate stream of the tokens a
    # drafting session would commit (centralized serving, the verifier decoding every token).
    generate: bool = False
    # Each device's link: a round trip drawn from [rtt_min_ms, rtt_max_ms] per device, waited before
    # each call as its drafting is (0: loopback only).
    rtt_min_ms: float = 0.0
    rtt_max_ms: float = 0.0
    # Devices draft what the verifier's budgets say (`next_budget`), up to k, where it assigns them.
    follow_budgets: bool = False
    # "fixed": blocks of k (or of the budget); "predictor": the traces' pair's shipped rejection
    # predictor stops each block, reading the recorded draft's logit features (traces only).
    drafting: str = "fixed"
    # Devices hold SLO classes (WISP's four, in turn: device i the (i mod 4)-th) and open their
    # sessions with the class's speed, as a WISP verifier schedules them; else best effort.
    slo: bool = False

    @property
    def max_context(self) -> int:
        """What a session may reach: its prompt, its tokens and a last block past them (toy pair)."""
        return self.prompt_len + self.tokens + self.k + 2


def toy_target(w: Workload) -> MemoToyLM:
    # continue_after_eog is set on every round, so the end-of-text token is just a token
    return MemoToyLM(w.vocab, seed=w.seed, name="toy-target")


def toy_draft(w: Workload) -> MemoToyLM:
    """The target with noise: the same tokenizer (fingerprint), logits that disagree now and then."""
    return MemoToyLM(w.vocab, seed=w.seed, noise=w.noise, name="toy-target")


class Tables:
    """For each prompt: the target's greedy continuation, and at each position i of it the
    draft's block there and how many of it greedy verification accepts (the token after them is
    the target's there).
    Built from the toy pair, or from recorded traces (`Workload.traces`), where a prompt's
    positions stop k + 1 short of its trace's end (the token after any block must be known)."""

    def __init__(self, w: Workload) -> None:
        self.workload = w
        self.prompts: list[list[int]] = []
        self.target: list[list[int]] = []
        self.blocks: list[list[tuple[int, ...]]] = []
        self.accepted: list[list[int]] = []
        self.traces: list[Any] = []  # the recorded traces the prompts are, where they are
        if w.drafting not in ("fixed", "predictor") or (w.drafting == "predictor" and not w.traces):
            raise ValueError(f"drafting {w.drafting!r}: 'fixed', or 'predictor' over recorded traces")
        if w.traces:
            self._from_traces(w)
        else:
            self._from_toy(w)

    def _from_toy(self, w: Workload) -> None:
        target, draft = toy_target(w), toy_draft(w)
        self.fingerprint = fingerprint_to_pb(target.fingerprint())
        self.draft_model = "toy-draft"
        rng = random.Random(w.seed)
        real = target.real_vocab_size
        span = w.tokens + w.k + 1
        for _ in range(w.prompts):
            prompt = [rng.randrange(2, real) for _ in range(w.prompt_len)]
            out = _greedy(target, prompt, span)
            self._add(prompt, out, [tuple(_greedy(draft, prompt + out[:i], w.k)) for i in range(w.tokens)])

    def _from_traces(self, w: Workload) -> None:
        traces, meta = load_traces(Path(w.traces))
        if w.k > meta["window"]:
            raise ValueError(f"the traces hold blocks of up to {meta['window']} tokens, not {w.k}")
        self.draft_model = meta["draft"]
        self.pair = (meta["draft"], meta["target"])
        for t in traces:
            if len(t.target) > w.k:
                self._add(t.prompt, t.target, [tuple(d[: w.k]) for d in t.drafts[: len(t.target) - w.k]])
                self.traces.append(t)
        if not self.prompts:
            raise ValueError(f"no trace in {w.traces} is longer than a block of {w.k}")
        self.fingerprint = fingerprint_to_pb(_vocabulary(w.tokenizer or _cached(meta["draft"])))

    def _add(self, prompt: list[int], out: list[int], blocks: list[tuple[int, ...]]) -> None:
        accepted = [_common_prefix(b, out[i:]) for i, b in enumerate(blocks)]
        self.prompts.append(prompt)
        self.target.append(out)
        self.blocks.append(blocks)
        self.accepted.append(accepted)

    def controller(self, predictor: Any = None) -> Any:
        """A device's drafting controller for `drafting="predictor"` (sharing `predictor`, an
        `OnnxPredictor` of the pair, where given: one per asyncio worker); None for fixed blocks."""
        if self.workload.drafting != "predictor":
            return None
        from edgekit.drafting import PredictorController

        return PredictorController(predictor or self.predictor(), self.workload.k)

    def predictor(self) -> Any:
        """The traces' pair's shipped greedy rejection predictor."""
        from edgekit.drafting import OnnxPredictor, shipped_predictor

        path = shipped_predictor(*self.pair, "greedy")
        if path is None:
            raise ValueError(f"no rejection predictor is shipped for {self.pair}")
        return OnnxPredictor(str(path))

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens, over every position of every prompt."""
        return sum(map(sum, self.accepted)) / sum(len(b) * self.workload.k for b in self.blocks)

    @property
    def max_context(self) -> int:
        """What a session may reach: its prompt, its tokens and a last block past them."""
        return max(len(p) + len(b) + self.workload.k + 2 for p, b in zip(self.prompts, self.blocks))


def _cached(model: str) -> str:
    from edgekit.models import model_path

    return str(model_path(model))


def _vocabulary(path: str) -> Any:
    """The tokenizer fingerprint of a GGUF, from its vocabulary alone (no weights loaded)."""
    from edgekit.runtime import LlamaModel

    vocab = LlamaModel(path, name=Path(path).stem, vocab_only=True)
    try:
        return vocab.fingerprint()
    finally:
        vocab.close()


def _greedy(lm: ToyLanguageModel, context: Sequence[int], n: int) -> list[int]:
    ctx, out = list(context), []
    for _ in range(n):
        ctx.append(int(np.argmax(lm.logits(ctx)[: lm.real_vocab_size])))
        out.append(ctx[-1])
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


# -- a device ------------------------------------------------------------------------------


@dataclass
class Tally:
    """A device's counts, a worker's once merged: rounds and their figures inside the window,
    errors and mismatches whenever they happen."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: float = 0  # a stream's tokens in the share of its time inside the window (`_generate`)
    sessions: int = 0  # opened inside the window
    server_queue_ms: float = 0.0  # the verdicts' own timings, summed
    server_verify_ms: float = 0.0
    batch_size: int = 0  # summed: over rounds, the mean works per batch a round ran in
    rounds_all: int = 0  # rounds whenever they finished (warm-up included)
    mismatches: int = 0
    mismatch_examples: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)  # by "Method STATUS"
    error_examples: list[str] = field(default_factory=list)
    rtt_ms: array = field(default_factory=lambda: array("d"))
    device_rounds: list[int] = field(default_factory=list)  # each device's rounds in the window: its share
    device_tokens: list[float] = field(default_factory=list)  # and its committed tokens there
    device_classes: list[str] = field(default_factory=list)  # and its SLO class ("" best effort)
    # seconds the devices spent inside the window waiting on each kind of call, summed over devices
    # ("Rounds (opening)": a stream's first round, the new call's acceptance with it): where they waited
    waits_s: Counter[str] = field(default_factory=Counter)
    flood_calls: int = 0  # an abusive device's calls answered in the window (`_flood`)
    flood_refusals: Counter[str] = field(default_factory=Counter)

    def merge(self, other: dict[str, Any]) -> None:
        for name in ("rounds", "drafted", "accepted", "committed", "sessions", "server_queue_ms",
                     "server_verify_ms", "batch_size", "rounds_all", "mismatches"):
            setattr(self, name, getattr(self, name) + other[name])
        self.mismatch_examples += other["mismatch_examples"][: 5 - len(self.mismatch_examples)]
        self.error_examples += other["error_examples"][: 5 - len(self.error_examples)]
        self.errors.update(other["errors"])
        self.rtt_ms.extend(other["rtt_ms"])
        self.device_rounds += other["device_rounds"] or [other["rounds"]]
        self.device_tokens += other["device_tokens"] or [other["committed"]]
        self.device_classes += other["device_classes"]
        self.waits_s.update(other["waits_s"])
        self.flood_calls += other["flood_calls"]
        self.flood_refusals.update(other["flood_refusals"])

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["errors"] = dict(self.errors)
        out["flood_refusals"] = dict(self.flood_refusals)
        out["waits_s"] = dict(self.waits_s)
        out["rtt_ms"] = list(self.rtt_ms)
        return out


Call = tuple[str, Any, float]  # (method, request, seconds to wait before sending it)
Answer = tuple[Any, float, float]  # (response or the grpc.RpcError, sent, answered): time.monotonic()


class Device:
    """One device's calls, as a generator: it yields each `Call` and is sent its `Answer`.
    Both drivers (asyncio, threads) run the same device."""

    def __init__(self, index: int, tables: Tables, window: tuple[float, float], controller: Any = None) -> None:
        self.index = index
        self.controller = controller  # None: fixed blocks (`Tables.controller`)
        self.t = tables
        self.tally = Tally()  # its own: devices on threads never add to one counter at once
        self.start, self.end = window
        self.rng = random.Random(index)
        w = tables.workload
        self.rtt_s = self.rng.uniform(w.rtt_min_ms, w.rtt_max_ms) / 1e3
        self.client_id = f"device-{index}"
        self.slo_name, self.slo_speed = list(SLO_CLASSES.items())[index % len(SLO_CLASSES)] if w.slo else ("", 0.0)

    def calls(self) -> Iterator[Call]:
        t, tally = self.t, self.tally
        w = t.workload
        fp = t.fingerprint
        answer = yield "Handshake", pb.HandshakeRequest(protocol_version=PROTOCOL_VERSION, draft_tokenizer=fp,
                                                        draft_model=t.draft_model), 0.0
        if self._failed(answer, "Handshake"):
            return
        sampling = sampling_to_pb("greedy", GREEDY, 0)
        backoff = 0.0
        while time.monotonic() < self.end:
            p = self.rng.randrange(len(t.prompts))
            prompt = t.prompts[p]
            if t.workload.generate:
                yield from self._generate(p, sampling)
                continue
            answer = yield "OpenSession", pb.OpenSessionRequest(
                prompt_tokens=prompt, sampling=sampling, draft_tokenizer=fp, client_id=self.client_id,
                slo_name=self.slo_name, target_tokens_per_s=self.slo_speed), backoff + self.rtt_s
            backoff = 0.05  # after a failure: not a storm of retries
            if self._failed(answer, "OpenSession"):
                continue
            opened, _, done = answer
            sid = opened.session_id
            if self.start <= done <= self.end:
                tally.sessions += 1
            i, base, n = 0, len(prompt), 0
            target, blocks, accepted = t.target[p], t.blocks[p], t.accepted[p]
            ok = opened.committed_length == base or self._mismatch(f"opened at {opened.committed_length}, not {base}")
            k = self._budget(opened.next_budget, w.k)
            while ok and i < len(blocks) and time.monotonic() < self.end:
                if self.controller is None:
                    block = blocks[i][:k]  # a cut block's accepted prefix is the whole block's, cut
                    a, steps = min(accepted[i], k), len(block)
                else:  # the predictor stops the recorded continuation (a stop costs the step it read)
                    cut, steps = draft_block(self.controller, t.traces[p], i, self.controller.window(k))
                    block, a = tuple(cut), _common_prefix(cut, target[i:])
                draft_s = w.draft_ms * steps / 1e3
                answer = yield "Verify", pb.VerifyRequest(
                    session_id=sid, base_position=base + i, draft_tokens=block, round_index=n,
                    continue_after_eog=True, draft_ms=draft_s * 1e3), draft_s + self.rtt_s
                if self._failed(answer, "Verify"):
                    ok = False
                    break
                r, sent, done = answer
                v = r.verdict
                if (r.WhichOneof("result") != "verdict" or v.accepted != a or v.next_token != target[i + a]
                        or v.committed_length != base + i + a + 1):
                    ok = self._mismatch(
                        f"prompt {p} at {i}: got accepted {v.accepted}, next {v.next_token}, committed "
                        f"{v.committed_length}; the target's greedy: accepted {a}, next {target[i + a]} "
                        f"({target[i:i + 6]})")
                    break
                if self.controller is not None:
                    self.controller.observe(len(block), v.accepted)
                k = self._budget(v.next_budget, k)
                tally.rounds_all += 1
                if self.start <= done <= self.end:
                    tally.rounds += 1
                    tally.drafted += len(block)
                    tally.accepted += a
                    tally.committed += a + 1
                    tally.server_queue_ms += r.timings.queue_ms
                    tally.server_verify_ms += r.timings.verify_ms
                    tally.batch_size += r.timings.batch_size
                    tally.rtt_ms.append((done - sent) * 1e3)
                i += a + 1
                n += 1
            answer = yield "CloseSession", pb.CloseSessionRequest(session_id=sid), 0.0
            if not self._failed(answer, "CloseSession"):
                backoff = 0.0

    def waited(self, call: str, sent: float, answered: float) -> None:
        """A call of kind `call` waited from `sent` to `answered`: its share inside the window."""
        inside = min(answered, self.end) - max(sent, self.start)
        if inside > 0:
            self.tally.waits_s[call] += inside

    def _budget(self, assigned: int, current: int) -> int:
        """The block a device drafts next: the verifier's budget where it assigns one and the
        devices follow them (up to the tables' k), else what it drafted."""
        w = self.t.workload
        return min(assigned, w.k) if assigned and w.follow_budgets else current

    def _generate(self, p: int, sampling: Any) -> Iterator[Call]:
        """One target-only stream of as many tokens as a drafting session commits, each checked."""
        t, tally = self.t, self.tally
        n = len(t.blocks[p])
        answer = yield "Generate", pb.GenerateRequest(
            prompt_tokens=t.prompts[p], sampling=sampling, max_tokens=n), self.rtt_s
        if self._failed(answer, "Generate"):
            return
        tokens, sent, done = answer
        got = [m.token for m in tokens]
        if not 0 < len(got) <= n or got != t.target[p][: len(got)]:
            self._mismatch(f"prompt {p}: streamed {got[:6]}... ({len(got)}), the target's {t.target[p][:6]}...")
            return
        tally.rounds_all += 1
        # its tokens count in the share of the stream's time inside the window (made at an even pace)
        overlap = min(done, self.end) - max(sent, self.start)
        if overlap > 0:
            tally.committed += len(got) * overlap / max(done - sent, 1e-9)
        if self.start <= done <= self.end:  # a stream counts as a round
            tally.rounds += 1
            tally.sessions += 1
            tally.rtt_ms.append((done - sent) * 1e3)

    def _failed(self, answer: Answer, method: str) -> bool:
        error = answer[0]
        if isinstance(error, grpc.RpcError):
            code = error.code() if hasattr(error, "code") else None
            self.tally.errors[f"{method} {getattr(code, 'name', type(error).__name__)}"] += 1
            if len(self.tally.error_examples) < 5:
                details = f"{error.details()} {error.debug_error_string()}" if hasattr(error, "details") else str(error)
                when = f"{time.monotonic() - self.start:+.2f} s into the window"
                self.tally.error_examples.append(f"device {self.index}, {method}, {when}: {details}"[:300])
            return True
        return False

    def _mismatch(self, what: str) -> bool:
        self.tally.mismatches += 1
        if len(self.tally.mismatch_examples) < 5:
            self.tally.mismatch_examples.append(f"device {self.index}: {what}")
        return False


_METHODS = {
    "Handshake": (pb.HandshakeRequest, pb.HandshakeResponse),
    "OpenSession": (pb.OpenSessionRequest, pb.OpenSessionResponse),
    "Verify": (pb.VerifyRequest, pb.VerifyResponse),
    "CloseSession": (pb.CloseSessionRequest, pb.CloseSessionResponse),
    "Generate": (pb.GenerateRequest, pb.GenerateResponse),  # a stream of answers: `_stubs`
}
_CHANNEL_OPTIONS = [("grpc.enable_retries", 0), ("grpc.max_receive_message_length", 16 << 20)]


def _tagged(stubs: dict[str, Callable[..., Any]], client_id: str) -> dict[str, Callable[..., Any]]:
    """`stubs` whose every call carries the device's client id (`x-edgekit-client`), as edgekit's
    client sends it, what a proxy's routing keys on, and a token of the device's own: the shipped
    proxy's per-client limit keys on the source address and the token (every device here shares
    loopback), and the verifier, which takes no tokens here, ignores it."""
    metadata = ((CLIENT_HEADER, client_id), ("authorization", f"Bearer {client_id}-token"))
    return {name: functools.partial(stub, metadata=metadata) for name, stub in stubs.items()}


def _stubs(channel: Any) -> dict[str, Callable[..., Any]]:
    stubs = {name: (channel.unary_stream if name == "Generate" else channel.unary_unary)(
        f"/{SERVICE_NAME}/{name}", request_serializer=req.SerializeToString, response_deserializer=resp.FromString)
        for name, (req, resp) in _METHODS.items()}
    stubs["Rounds"] = channel.stream_stream(f"/{SERVICE_NAME}/Rounds",
                                            request_serializer=pb.VerifyRequest.SerializeToString,
                                            response_deserializer=pb.VerifyResponse.FromString)
    return stubs


async def _drive_aio(device: Device, stubs: dict[str, Callable[..., Any]], rounds: str = "unary") -> None:
    """A device's calls, each awaited; with `rounds="stream"` its session's rounds on one Rounds
    stream (opened at the session's first round, closed with it), as edgekit's client sends them."""
    calls = device.calls()
    answer: Answer | None = None
    stream: Any = None
    while True:
        try:
            method, request, wait = calls.send(answer)  # type: ignore[arg-type]
        except StopIteration:
            break
        if wait:
            await asyncio.sleep(wait)
        sent = time.monotonic()
        call = method
        try:
            if method == "Verify" and rounds == "stream":
                call = "Rounds"
                if stream is None:
                    stream, call = stubs["Rounds"](timeout=600.0), "Rounds (opening)"
                await stream.write(request)
                response = await stream.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError("the verifier ended the stream of rounds")
            elif method == "Generate":
                response = [m async for m in stubs[method](request, timeout=120.0)]
            else:
                if method == "CloseSession" and stream is not None:
                    await _end(stream)
                    stream = None
                response = await stubs[method](request, timeout=120.0)
        except grpc.RpcError as exc:
            response, stream = exc, None
        answer = (response, sent, time.monotonic())
        device.waited(call, sent, answer[2])
    if stream is not None:
        await _end(stream)


async def _end(stream: Any) -> None:
    await stream.done_writing()
    while await stream.read() is not grpc.aio.EOF:
        pass


def _drive_blocking(device: Device, stubs: dict[str, Callable[..., Any]]) -> None:
    calls = device.calls()
    answer: Answer | None = None
    while True:
        try:
            method, request, wait = calls.send(answer)  # type: ignore[arg-type]
        except StopIteration:
            return
        if wait:
            time.sleep(wait)
        sent = time.monotonic()
        try:
            response = stubs[method](request, timeout=120.0)
            if method == "Generate":
                response = list(response)
        except grpc.RpcError as exc:
            response = exc
        answer = (response, sent, time.monotonic())
        device.waited(method, sent, answer[2])


async def _run_aio(devices: list[Device], address: str, per_device: bool, rounds: str = "unary",
                   flood: int = 0, tally: Tally | None = None) -> None:
    channels = [grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
                for _ in (devices if per_device else [None])]
    stubs = [_stubs(c) for c in channels]
    honest = [_drive_aio(d, _tagged(stubs[i if per_device else 0], d.client_id), rounds) for i, d in enumerate(devices)]
    abuse = [_flood(address, devices[0], flood, tally)] if flood and tally is not None else []
    await asyncio.gather(*honest, *abuse)
    for c in channels:
        await c.close()


async def _flood(address: str, like: Device, calls: int, tally: Tally) -> None:
    """An abusive device on a connection of its own: one session, and `calls` Verify calls of
    its first round always in flight, each sent again the moment it is answered, until the
    window ends. Its answers are counted (`flood_calls`), not its rounds."""
    channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
    stubs = _tagged(_stubs(channel), "flooder")
    t = like.t
    try:
        await stubs["Handshake"](pb.HandshakeRequest(protocol_version=PROTOCOL_VERSION, draft_tokenizer=t.fingerprint,
                                                     draft_model=t.draft_model), timeout=120.0)
        opened = await stubs["OpenSession"](pb.OpenSessionRequest(
            prompt_tokens=t.prompts[0], sampling=sampling_to_pb("greedy", GREEDY, 0), draft_tokenizer=t.fingerprint,
            client_id="flooder"), timeout=120.0)
    except grpc.RpcError as exc:
        tally.errors[f"flood {exc.code().name}"] += 1  # type: ignore[attr-defined]
        await channel.close()
        return
    request = pb.VerifyRequest(session_id=opened.session_id, base_position=len(t.prompts[0]),
                               draft_tokens=t.blocks[0][0], continue_after_eog=True)

    async def again() -> None:
        while time.monotonic() < like.end:
            try:
                await stubs["Verify"](request, timeout=120.0)
            except grpc.RpcError as exc:
                tally.flood_refusals[exc.code().name] += 1  # type: ignore[attr-defined]
                continue
            tally.flood_calls += like.start <= time.monotonic() <= like.end

    await asyncio.gather(*(again() for _ in range(calls)))
    await channel.close()


def _run_threads(devices: list[Device], address: str, per_device: bool) -> None:
    channels = [grpc.insecure_channel(address, options=_CHANNEL_OPTIONS) for _ in (devices if per_device else [None])]
    stubs = [_stubs(c) for c in channels]
    threads = [threading.Thread(target=_drive_blocking, args=(d, _tagged(stubs[i if per_device else 0], d.client_id)),
                                daemon=True)
               for i, d in enumerate(devices)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in channels:
        c.close()


def worker_main() -> None:
    """A worker process: its spec on stdin, "ready", the window on stdin, then its tally on stdout."""
    spec = _read_line()
    prepare_process(spec.get("cores"))
    tables = Tables(Workload(**spec["workload"]))
    _write_line({"ready": True, "acceptance": tables.acceptance})
    window = _read_line()
    per_device = spec.get("channels", "device") == "device"
    rounds = spec.get("rounds", "unary")
    aio = spec.get("mode", "aio") == "aio"
    # asyncio: the worker's devices share one predictor (its decisions never interleave); threads: one each
    shared = tables.predictor() if aio and tables.workload.drafting == "predictor" else None
    devices = [Device(i, tables, (window["start"], window["end"]), tables.controller(shared)) for i in spec["devices"]]
    flooder = Tally()  # an abusive device's, kept apart from the devices' shares
    if aio:
        asyncio.run(_run_aio(devices, spec["address"], per_device, rounds, spec.get("flood", 0), flooder))
    else:
        if rounds != "unary" or spec.get("flood"):
            raise SystemExit("the threads generator sends Verify calls only, and floods none: use --mode aio")
        _run_threads(devices, spec["address"], per_device)
    tally = Tally()
    for d in devices:
        d.tally.device_classes = [d.slo_name]
        tally.merge(d.tally.as_json())
    tally.flood_calls, tally.flood_refusals = flooder.flood_calls, flooder.flood_refusals
    tally.errors.update(flooder.errors)
    _write_line({"tally": tally.as_json()})


# -- the instant verifier ------------------------------------------------------------------


def instant_main() -> None:
    """A verifier that answers every call at once, from the tables: the generator's ceiling."""
    spec = _read_line()
    prepare_process(spec.get("cores"))
    tables = Tables(Workload(**spec["workload"]))
    by_prompt = {tuple(p): i for i, p in enumerate(tables.prompts)}
    counter = iter(range(1 << 62))

    def handshake(req: Any, context: Any) -> Any:
        return pb.HandshakeResponse(protocol_version=PROTOCOL_VERSION)

    def open_session(req: Any, context: Any) -> Any:
        p = by_prompt[tuple(req.prompt_tokens)]
        return pb.OpenSessionResponse(session_id=f"{p}/{next(counter)}", committed_length=len(req.prompt_tokens))

    def verify(req: Any, context: Any) -> Any:
        p = int(req.session_id.split("/", 1)[0])
        i = req.base_position - len(tables.prompts[p])
        out = tables.target[p]
        a = _common_prefix(req.draft_tokens, out[i:])
        return pb.VerifyResponse(
            verdict=pb.Verdict(accepted=a, next_token=out[i + a], committed_length=req.base_position + a + 1),
            timings=pb.ServerTimings(batch_size=1))

    def close_session(req: Any, context: Any) -> Any:
        return pb.CloseSessionResponse()

    def generate(req: Any, context: Any) -> Any:
        out = tables.target[by_prompt[tuple(req.prompt_tokens)]]
        for i, token in enumerate(out[: req.max_tokens]):
            yield pb.GenerateResponse(token=token, index=i)

    handlers = {"Handshake": handshake, "OpenSession": open_session, "Verify": verify, "CloseSession": close_session}
    methods = {name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=_METHODS[name][0].FromString,
                                                       response_serializer=_METHODS[name][1].SerializeToString)
             for name, fn in handlers.items()}
    methods["Generate"] = grpc.unary_stream_rpc_method_handler(
        generate, request_deserializer=pb.GenerateRequest.FromString,
        response_serializer=pb.GenerateResponse.SerializeToString)

    def rounds(requests: Any, context: Any) -> Any:
        for req in requests:
            yield verify(req, context)

    methods["Rounds"] = grpc.stream_stream_rpc_method_handler(
        rounds, request_deserializer=pb.VerifyRequest.FromString,
        response_serializer=pb.VerifyResponse.SerializeToString)
    generic = grpc.method_handlers_generic_handler(SERVICE_NAME, methods)
    # Built as the verifier's server is (a thread per call or stream in flight): on grpc.aio the same
    # stub cost the server's core 1.6x the CPU a unary round (770 against 475 us, 64 devices, 2-core VM).
    handlers_n = spec["max_sessions"] + 8
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=handlers_n),
                         options=[("grpc.so_reuseport", 0), ("grpc.server.max_pending_requests", 2 * handlers_n),
                                  ("grpc.server.max_pending_requests_hard_limit", 4 * handlers_n)])
    server.add_generic_rpc_handlers((generic,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _serve_commands(port)
    server.stop(0.5).wait()


def _serve_commands(port: int) -> None:
    """Says the server is ready, then answers "stats" (its CPU so far) until "quit"."""
    _write_line({"ready": True, "address": f"127.0.0.1:{port}", "pid": os.getpid()})
    for line in sys.stdin:
        if json.loads(line)["command"] == "quit":
            return
        _write_line({"cpu_s": sum(os.times()[:2]), "t": time.monotonic()})


# -- processes -------------------------------------------------------------------------------


def _read_line() -> dict[str, Any]:
    return json.loads(sys.stdin.readline())


def _write_line(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def prepare_process(cores: Iterable[int] | None) -> None:
    """Pins this process to `cores`, and lets it open as many files as it may: a connection per
    device is a socket each, past the 1,024 many systems allow by default."""
    import resource

    if cores:
        os.sched_setaffinity(0, set(cores))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and (hard == unlimited or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1 << 20) if hard == unlimited else hard, hard))


def parse_cores(text: str) -> list[int]:
    """'0', '1-3', '0,2,4-7' -> core numbers."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


class LineProcess:
    """A child process spoken to in JSON lines over its stdin and stdout (other lines it prints,
    a profiler's say, are skipped)."""

    def __init__(self, cmd: Sequence[str], *, cores: Sequence[int] | None = None, log: Path | None = None) -> None:
        self._log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115  (closed in `wait`)
        self.proc = subprocess.Popen(
            list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
            preexec_fn=(lambda: os.sched_setaffinity(0, set(cores))) if cores else None,
            env={**C.module_env(), "PYTHONUNBUFFERED": "1"},  # a module of the package: it finds it
        )

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.proc.args[:4]} ended (exit {self.proc.wait()}) without answering")
            if line.startswith("{"):
                return json.loads(line)

    def wait(self, timeout: float = 60.0) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            if self._log is not subprocess.DEVNULL:
                self._log.close()  # type: ignore[union-attr]


def spawn(role: str, spec: dict[str, Any], *, cores: Sequence[int] | None = None,
          log: Path | None = None) -> LineProcess:
    """A worker or an instant verifier (`role`) in a process of its own, pinned to `cores`, told `spec`."""
    proc = LineProcess(C.module_command("benchmarks.rigs.loadgen", role), cores=cores, log=log)
    proc.send({**spec, "cores": list(cores) if cores else None})
    return proc


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid`, all its threads, so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    {"worker": worker_main, "instant": instant_main}[sys.argv[1]]()
