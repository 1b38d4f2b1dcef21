"""Messages to fuzz the verifier with, and what it may answer (issue 16, item 5).

Shared by tests/test_fuzz.py (a short run in CI) and benchmarks/fuzz.py (the long
run). Two kinds of input per RPC: arbitrary bytes, and messages built field by
field from the RPC's protobuf descriptor with hostile values (ids out of range,
negative and huge numbers, NaN and infinities, unknown enum values, long strings
and lists), where a session id is often a live session's and a position near its
real one, so that the fuzz reaches the rounds and not only the first check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
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
        if f.type == FieldDescriptor.TYPE_MESSAGE:
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
