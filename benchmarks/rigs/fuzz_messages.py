"""Messages to fuzz the verifier with, and what it may answer (issue 16, item 5).

Shared by tests/unit/verifier/test_fuzz.py (a short run in CI) and the fuzz benchmark (the long
run). Three kinds of input per RPC: arbitrary bytes; messages built field by
field from the RPC's protobuf descriptor with hostile values (ids out of range,
negative and huge numbers, NaN and infinities, unknown enum values, long strings
and lists), where a session id is often a live session's and a position near its
real one; and valid messages (the right fingerprint, a live session of the
fuzzer's at its true position, `Aim`) with one or two fields mutated, so that the
fuzz reaches the rounds and not only the first checks.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import strategies as st

from edgekit.protocol import SERVICE_NAME, pb

UNARY = {
    "Handshake": pb.HandshakeRequest,
    "Ping": pb.PingRequest,
    "OpenSession": pb.OpenSessionRequest,
    "ExtendSession": pb.ExtendSessionRequest,
    "Verify": pb.VerifyRequest,
    "CloseSession": pb.CloseSessionRequest,
}
STREAM = {"Generate": pb.GenerateRequest}
METHODS = {**UNARY, **STREAM}

# What a refusal may be; UNKNOWN (an unhandled exception), INTERNAL (a bug) or UNIMPLEMENTED never.
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION,
}

_INT = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


class _Live(int):
    """The i-th live session's id (or, for a position, the i-th live session's length), chosen when
    the message is built: the strategy itself must not depend on what is live (hypothesis replays it)."""


def _scalar(f: FieldDescriptor, vocab: int) -> st.SearchStrategy:
    t = f.type
    if t in _INT:
        lo, hi = _INT[t]
        likely = st.integers(max(lo, -1), min(hi, vocab + 1))  # token ids and small counts
        if "position" in f.name or "length" in f.name:
            likely = st.integers(0, 7).map(_Live) | st.integers(0, 64)
        return likely | st.integers(lo, hi) | st.sampled_from([lo, hi])
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.sampled_from(known) | st.integers(-(2**31), 2**31 - 1)
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if t == FieldDescriptor.TYPE_FLOAT else 64) | (
            st.sampled_from([0.0, -1.0, 1e-9, 1.0, 8.0, math.inf, -math.inf, math.nan])
        )
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        text = st.text(max_size=64) | st.text(min_size=1000, max_size=20_000, alphabet="xyz")
        if "session" in f.name:
            return st.integers(0, 7).map(_Live) | text
        return text | st.sampled_from(["realtime", "relaxed", ""])
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=512) | st.binary(min_size=4096, max_size=70_000)
    raise AssertionError(f"no strategy for field {f.full_name} of type {t}")


def _fields(desc: Descriptor, vocab: int, depth: int, long: int) -> st.SearchStrategy:
    parts: dict[str, st.SearchStrategy] = {}
    for f in desc.fields:
        if _is_map(f):  # token id -> bias: any key, any value, few or many
            key, value = (_scalar(f.message_type.fields_by_name[n], vocab) for n in ("key", "value"))
            parts[f.name] = st.dictionaries(key, value, max_size=12) | st.dictionaries(key, value, max_size=long)
            continue
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 3:
                continue
            one = _fields(f.message_type, vocab, depth + 1, long)
        else:
            one = _scalar(f, vocab)
        if _repeated(f):
            one = st.lists(one, max_size=12) | st.lists(one, min_size=min(200, long), max_size=long)
        parts[f.name] = one
    return st.fixed_dictionaries({}, optional=parts)


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


def _repeated(f: FieldDescriptor) -> bool:
    is_repeated = getattr(f, "is_repeated", None)  # protobuf 6; `label` before
    return bool(is_repeated) if is_repeated is not None else f.label == FieldDescriptor.LABEL_REPEATED


def _fill(msg: Message, values: dict, sessions: Sequence[str], near: Sequence[int]) -> None:
    def live(v: object) -> object:
        if not isinstance(v, _Live):
            return v
        pool = sessions if isinstance(getattr(msg, name), str) else near
        return pool[v % len(pool)] if pool else ("" if pool is sessions else 0)

    for name, value in values.items():
        f = msg.DESCRIPTOR.fields_by_name[name]
        if _is_map(f):
            getattr(msg, name).update(value)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            if _repeated(f):
                for v in value:
                    _fill(getattr(msg, name).add(), v, sessions, near)
            else:
                _fill(getattr(msg, name), value, sessions, near)
        elif _repeated(f):
            getattr(msg, name).extend(value)
        else:
            setattr(msg, name, live(value))


def requests(
    method: str,
    *,
    vocab: int,
    sessions: Callable[[], Sequence[str]],
    near: Callable[[], Sequence[int]],
    long_lists: int = 3000,
) -> st.SearchStrategy[bytes]:
    """Payloads for `method`: arbitrary bytes, or a hostile message of its type serialized
    (its long lists up to `long_lists` items: prompts that long cost a real target a prefill)."""
    cls = METHODS[method]

    @st.composite
    def built(draw: st.DrawFn) -> bytes:
        values = draw(_fields(cls.DESCRIPTOR, vocab, 0, long_lists))
        msg = cls()
        _fill(msg, values, list(sessions()), list(near()))
        return msg.SerializeToString()

    return st.binary(max_size=2048) | built()


def call(
    channel: grpc.Channel, method: str, payload: bytes, metadata=(), timeout: float = 20.0
) -> tuple[grpc.StatusCode, str, bytes]:
    """One raw call: its status code, details ("" on success) and answer (b"" for a stream or a refusal)."""
    path = f"/{SERVICE_NAME}/{method}"
    answer = b""
    try:
        if method in STREAM:
            for _ in channel.unary_stream(path)(payload, timeout=timeout, metadata=metadata):
                pass
        else:
            answer = channel.unary_unary(path)(payload, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", b""
    return grpc.StatusCode.OK, "", answer


# -- valid messages, mutated: deep enough to reach the rounds -----------------------------


class Aim:
    """The fuzzer's own sessions and their committed lengths, learnt from the answers it gets,
    so that a message built from a valid one carries a live session id and its true base
    position (and so passes the first checks and reaches the rounds)."""

    def __init__(self) -> None:
        self.lengths: dict[str, int] = {}
        self._lock = threading.Lock()

    def pick(self, i: int) -> tuple[str, int] | None:
        with self._lock:
            items = sorted(self.lengths.items())
        return items[i % len(items)] if items else None

    def replenish(self, channel: grpc.Channel, metadata, *, fingerprint: Message, hidden: int, prompt: list[int],
                  timeout: float = 20.0) -> grpc.StatusCode | None:
        """Open a session with a valid message when none is left to aim at (None when one is).

        The fuzzer's sessions end under it: its own CloseSession calls close them, and a
        well-behaved client beside it, holding less than half the table, takes the least
        recently used of theirs. Left to the fuzz's own OpenSession calls (most of them
        hostile, many refused for room), a run spent long stretches with nothing to aim at,
        and in one CI run of 700 messages not one ExtendSession reached a round."""
        if self.pick(0) is not None:
            return None
        payload = _valid("OpenSession", fingerprint, hidden, prompt, [], None).SerializeToString()  # type: ignore[union-attr]
        code, _, answer = call(channel, "OpenSession", payload, metadata, timeout)
        self.learn("OpenSession", payload, code, answer)
        return code

    def learn(self, method: str, payload: bytes, code: grpc.StatusCode, answer: bytes) -> None:
        try:
            request = METHODS[method].FromString(payload)
        except DecodeError:
            return
        sid = getattr(request, "session_id", "")
        with self._lock:
            if code == grpc.StatusCode.NOT_FOUND:
                self.lengths.pop(sid, None)
            if code != grpc.StatusCode.OK:
                return
            if method == "OpenSession":
                opened = pb.OpenSessionResponse.FromString(answer)
                self.lengths[opened.session_id] = opened.committed_length
            elif method == "CloseSession":
                self.lengths.pop(sid, None)
            elif sid in self.lengths and method == "ExtendSession":
                self.lengths[sid] = pb.ExtendSessionResponse.FromString(answer).committed_length
            elif sid in self.lengths and method == "Verify":
                verified = pb.VerifyResponse.FromString(answer)
                if verified.HasField("verdict"):
                    self.lengths[sid] = verified.verdict.committed_length


def _leaves(desc: Descriptor, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], FieldDescriptor]]:
    """Every field a mutation may set: scalars and repeated scalars, one level into sub-messages."""
    out = []
    for f in desc.fields:
        if f.type != FieldDescriptor.TYPE_MESSAGE:
            out.append(((*prefix, f.name), f))
        elif not _repeated(f) and not prefix:
            out += _leaves(f.message_type, (f.name,))
    return out


def _valid(method: str, fingerprint: Message, hidden: int, prompt: list[int], block: list[int],
           aim: tuple[str, int] | None) -> Message | None:
    greedy = pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY)
    if method == "Handshake":
        return pb.HandshakeRequest(protocol_version=2, draft_tokenizer=fingerprint, draft_model="fuzz",
                                   draft_hidden_size=hidden)
    if method == "Ping":
        return pb.PingRequest(payload=bytes(16), reply_bytes=16)
    if method == "OpenSession":
        return pb.OpenSessionRequest(prompt_tokens=prompt, sampling=greedy, draft_tokenizer=fingerprint,
                                     draft_hidden_size=hidden)
    if method == "Generate":
        return pb.GenerateRequest(prompt_tokens=prompt, sampling=greedy, max_tokens=4)
    if aim is None:
        return None  # nothing live to aim at yet
    sid, length = aim
    if method == "ExtendSession":
        return pb.ExtendSessionRequest(session_id=sid, base_position=length, tokens=block or prompt)
    if method == "Verify":
        return pb.VerifyRequest(session_id=sid, base_position=length, draft_tokens=block)
    return pb.CloseSessionRequest(session_id=sid)


def _set(msg: Message, path: tuple[str, ...], f: FieldDescriptor, value: object, aim: Aim) -> None:
    for name in path[:-1]:
        msg = getattr(msg, name)
    if isinstance(value, _Live):
        live = aim.pick(int(value))
        value = ("" if live is None else live[0]) if f.type == FieldDescriptor.TYPE_STRING else (live or ("", 0))[1]
    try:
        if _repeated(f):
            field = getattr(msg, path[-1])
            del field[:]
            field.extend(value)  # type: ignore[arg-type]
        else:
            setattr(msg, path[-1], value)
    except (TypeError, ValueError):
        pass  # a value protobuf itself refuses to hold (an int32 out of range): the field keeps its value


def mutated(
    method: str, *, vocab: int, fingerprint: Message, hidden: int, aim: Aim, long_lists: int = 3000
) -> st.SearchStrategy[bytes]:
    """A valid message for `method` (aimed at one of the fuzzer's live sessions, at its true
    position), with none, one or two of its fields given a hostile value."""
    leaves = _leaves(METHODS[method].DESCRIPTOR)
    tokens = st.integers(1, vocab - 1)

    def hostile(leaf: tuple[tuple[str, ...], FieldDescriptor]) -> st.SearchStrategy:
        one = _scalar(leaf[1], vocab)
        if _repeated(leaf[1]):
            one = st.lists(one, max_size=12) | st.lists(one, min_size=min(200, long_lists), max_size=long_lists)
        return one.map(lambda v: (leaf, v))

    @st.composite
    def built(draw: st.DrawFn) -> bytes:
        target = draw(st.integers(0, 63))
        prompt = draw(st.lists(tokens, min_size=1, max_size=24))
        block = draw(st.lists(tokens, max_size=8))
        changes = draw(st.lists(st.sampled_from(leaves).flatmap(hostile), max_size=2))
        msg = _valid(method, fingerprint, hidden, prompt, block, aim.pick(target))
        if msg is None:
            return b""
        for (path, f), value in changes:
            _set(msg, path, f, value, aim)
        return msg.SerializeToString()

    return built()
