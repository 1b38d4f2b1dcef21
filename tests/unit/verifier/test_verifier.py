"""The reference verifier's logic over a toy engine, without model files: sessions
and their limits, rounds, replays, stale rounds, FH and SH, bad input, the
target-only baseline, the scheduler seam, and gRPC's refusals, auth and health.

Most tests go through `InProcessTransport` (the real service, requests as
serialized protobuf); those about what gRPC adds run a real `VerifierServer` over
the toy engine on a loopback port. The same behaviour on the real gemma target is
in tests/integration/test_verifier_errors.py and tests/integration/test_uploads_gemma.py.
"""

from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from edgekit import (
    AuthenticationError,
    ClientConfig,
    EdgeClient,
    GenerationConfig,
    IncompatibleModelsError,
    LimitExceededError,
    ProtocolError,
    ServerConfig,
    SessionNotFoundError,
    StaleRoundError,
)
from edgekit.protocol import (
    BlockRequest,
    GenerateRequest,
    OpenRequest,
    Sampler,
    encode_hidden,
    fingerprint_to_pb,
    hidden_to_pb,
    pb,
    status_of,
)
from edgekit.testing import (
    FakeDraftModel,
    InProcessTransport,
    ManualClock,
    SimulatedLink,
    ToyLanguageModel,
    toy_server,
    toy_verifier,
)
from edgekit.transport import GrpcTransport
from edgekit.verifier import FcfsScheduler, ToyEngine, VerifierService

TARGET = ToyLanguageModel(seed=21)
DRAFT = FakeDraftModel(ToyLanguageModel(seed=21, noise=2.0), n_embd=16)
PROMPT = DRAFT.tokenize("hello there, general")


def _verifier(**config) -> InProcessTransport:
    return toy_verifier(TARGET, **({"max_block": 8, "max_context": 64, "max_sessions": 2, "hidden_size": 16} | config))


def _open(v: InProcessTransport, prompt=PROMPT, **kw):
    args = {"mode": "greedy", "seed": 0, "draft": DRAFT.fingerprint(),
            "draft_hidden_size": 16} | kw
    return v.open_session(OpenRequest(prompt, **args))



def _state(v: InProcessTransport, sid: str):
    return v.service.sessions.get(sid)


def _kv_ok(v: InProcessTransport, sid: str) -> bool:
    """The session's KV holds its committed tokens but the last (a rejected block's
    cells may follow them: the session's next feed starts before them and cuts them)."""
    s = _state(v, sid)
    return v.service.engine.sequence(s.seq)[: len(s.tokens) - 1] == tuple(s.tokens[:-1])


def _raw(v: InProcessTransport, method: str, msg):
    """A request as bytes, straight into the service; the status it is refused with, or the answer."""
    try:
        return v.service.call(method, msg if isinstance(msg, bytes) else msg.SerializeToString())
    except Exception as exc:
        return status_of(exc)


# -- rounds -------------------------------------------------------------------------------


def test_rounds_commit_the_targets_greedy_tokens_and_keep_the_kv_at_the_prefix():
    v = _verifier()
    opened = _open(v)
    base = opened.committed_length
    assert _kv_ok(v, opened.session_id)
    reference = TARGET.greedy(PROMPT, 30)
    committed: list[int] = []
    while len(committed) < 24:
        block = reference[len(committed) : len(committed) + 3] + [5]  # three right, one most likely wrong
        r = v.verify(BlockRequest(session_id=opened.session_id, base_position=base, draft_tokens=block))
        new = block[: r.accepted] + [r.next_token]
        assert r.accepted >= 3 and r.committed_length == base + len(new)
        committed += new
        base = r.committed_length
        assert _kv_ok(v, opened.session_id)
    assert committed == reference[: len(committed)]
    assert _state(v, opened.session_id).tokens == PROMPT + committed


def test_a_round_decodes_only_the_last_token_and_the_block():
    v = _verifier()
    opened = _open(v)
    state = _state(v, opened.session_id)
    assert state.decoded == len(PROMPT) - 1  # the prompt's last token waits for the first round
    base = opened.committed_length
    for k in (4, 0, 2):
        before = state.decoded
        r = v.verify(BlockRequest(session_id=opened.session_id, base_position=base, draft_tokens=[7] * k))
        assert state.decoded - before == k + 1
        base = r.committed_length


def test_an_empty_block_is_one_target_step():
    v = _verifier()
    opened = _open(v)
    r = v.verify(BlockRequest(session_id=opened.session_id, base_position=opened.committed_length, draft_tokens=[]))
    assert (r.accepted, r.next_token, r.bonus) == (0, TARGET.greedy(PROMPT, 1)[0], True)


def test_a_stale_round_is_detected_and_a_retry_is_applied_once():
    v = _verifier()
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    block = BlockRequest(session_id=sid, base_position=base, draft_tokens=TARGET.greedy(PROMPT, 3))
    first = v.verify(block)
    state = _state(v, sid)
    assert len(state.tokens) == first.committed_length
    again = v.verify(block)  # a retried round (say, after a lost reply): same verdict, not applied twice
    assert again == first and len(state.tokens) == first.committed_length and _kv_ok(v, sid)
    with pytest.raises(StaleRoundError) as info:
        v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[10, 20]))
    assert info.value.committed_length == first.committed_length and info.value.code == "ABORTED"
    assert len(state.tokens) == first.committed_length and _kv_ok(v, sid)


def test_an_accepted_end_token_ends_the_round_unless_asked_to_go_on():
    eos = TARGET.eos
    lm = ToyLanguageModel(seed=21, eos_bias=9.0)  # the target all but always ends the text
    v = toy_verifier(lm, max_block=8, max_context=64)
    opened = _open(v)
    r = v.verify(BlockRequest(session_id=opened.session_id, base_position=opened.committed_length,
                              draft_tokens=[eos, 9]))
    assert (r.accepted, r.next_token, r.bonus) == (1, None, False)
    assert r.committed_length == opened.committed_length + 1
    opened = _open(v)
    r = v.verify(BlockRequest(session_id=opened.session_id, base_position=opened.committed_length,
                              draft_tokens=[eos], continue_after_eog=True))
    assert r.accepted == 1 and r.next_token is not None and r.bonus


def test_sampling_rounds_take_valid_distributions_and_refuse_the_rest():
    from edgekit.protocol import SparseDistribution

    v = _verifier()
    opened = _open(v, mode="sample", sampler=Sampler(temperature=0.8), seed=3)
    sid, base = opened.session_id, opened.committed_length

    def dist(ids, probs):
        return SparseDistribution(np.array(ids, np.int32), np.array(probs, np.float32))

    bad = [
        ([dist([5], [1.0])], [5, 6], "one draft distribution per draft token"),
        ([dist([5, 6], [0.5, 0.2]), dist([6], [1.0])], [5, 6], "not a probability distribution"),
        ([dist([7, 8], [0.5, 0.5]), dist([6], [1.0])], [5, 6], "outside its draft distribution"),
        ([dist([5, 5], [0.5, 0.5]), dist([6], [1.0])], [5, 6], "out of range or repeated"),
        ([dist([5, 99], [0.5, 0.5]), dist([6], [1.0])], [5, 6], "out of range or repeated"),
    ]
    for dists, block, match in bad:
        with pytest.raises(ProtocolError, match=match):
            v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=block, draft_distributions=dists))
    r = v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5, 6],
                              draft_distributions=[dist([5, 6], [0.5, 0.5]), dist([6], [1.0])]))
    assert r.committed_length == base + r.accepted + 1 and _kv_ok(v, sid)
    with pytest.raises(ProtocolError, match="temperature > 0"):
        _open(v, mode="sample", sampler=Sampler(temperature=0.0))


# -- sessions and limits --------------------------------------------------------------------


def test_unknown_and_closed_sessions_are_not_found():
    v = _verifier()
    with pytest.raises(SessionNotFoundError) as info:
        v.verify(BlockRequest(session_id="s-doesnotexist", base_position=3, draft_tokens=[5]))
    assert info.value.code == "NOT_FOUND" and info.value.address == v.address
    opened = _open(v)
    v.close_session(opened.session_id)
    with pytest.raises(SessionNotFoundError):
        v.verify(BlockRequest(session_id=opened.session_id, base_position=opened.committed_length, draft_tokens=[5]))
    with pytest.raises(SessionNotFoundError):
        v.close_session(opened.session_id)



def _clocked(clock: ManualClock, **config) -> InProcessTransport:
    """`_verifier`, its session idleness measured on `clock`."""
    c = ServerConfig(**({"port": 0, "max_block": 8, "max_context": 64, "max_sessions": 2} | config))
    engine = ToyEngine(TARGET, n_seq=c.max_sessions, max_context=c.max_context, hidden_size=16)
    return InProcessTransport(VerifierService(engine, c, clock=clock), link=SimulatedLink())


def test_a_full_table_refuses_then_evicts_the_idle_session():
    clock = ManualClock()
    v = _clocked(clock, idle_timeout=0.3)
    a = _open(v)
    clock.now += 0.1
    _open(v)
    clock.now += 0.1
    with pytest.raises(LimitExceededError, match="maximum of 2 sessions"):
        _open(v)  # both sessions are fresh: nothing is idle yet
    clock.now += 0.4  # both idle past the timeout now
    c = _open(v)  # evicts the least recently used idle session: a
    with pytest.raises(SessionNotFoundError):
        v.verify(BlockRequest(session_id=a.session_id, base_position=a.committed_length, draft_tokens=[5]))
    assert _kv_ok(v, c.session_id) and v.service.sessions.evictions == 1


def test_the_reaper_evicts_idle_sessions_only():
    clock = ManualClock()
    v = _clocked(clock, idle_timeout=0.3)
    old = _open(v)
    clock.now += 0.4
    fresh = _open(v)
    clock.now += 0.29  # fresh is still within its idle timeout
    assert v.service.sessions.reap() == 1
    with pytest.raises(SessionNotFoundError):
        v.verify(BlockRequest(session_id=old.session_id, base_position=old.committed_length, draft_tokens=[]))
    v.verify(BlockRequest(session_id=fresh.session_id, base_position=fresh.committed_length, draft_tokens=[]))


def test_context_limits_are_out_of_range_and_change_nothing():
    v = _verifier(max_context=28)
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length  # 21 tokens
    with pytest.raises(LimitExceededError, match="exceeds the context limit of 28") as info:
        v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5] * 8))
    assert info.value.code == "OUT_OF_RANGE"
    with pytest.raises(LimitExceededError, match="extending to 33 tokens") as info:
        v.extend_session(sid, base, [5] * 12)
    assert info.value.code == "OUT_OF_RANGE"
    with pytest.raises(ProtocolError, match="prompt of 40 tokens exceeds the context limit"):
        _open(v, prompt=[5] * 40)
    assert len(_state(v, sid).tokens) == base and _kv_ok(v, sid)
    v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5] * 4))


def test_a_full_kv_cache_is_resource_exhausted_and_leaves_the_session_as_it_was():
    config = ServerConfig(port=0, max_sessions=2, max_context=64, max_block=8)
    engine = ToyEngine(TARGET, n_seq=2, max_context=24)  # smaller than the sessions' limit
    v = InProcessTransport(VerifierService(engine, config))
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    with pytest.raises(LimitExceededError, match="no free KV cells") as info:
        v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5] * 6))
    assert info.value.code == "RESOURCE_EXHAUSTED"
    assert len(_state(v, sid).tokens) == base and _kv_ok(v, sid)
    r = v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5]))
    assert r.committed_length > base


def test_extending_a_session_appends_a_turn_and_checks_its_base():
    v = _verifier()
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    turn = DRAFT.tokenize(" and then", add_special=False)
    assert v.extend_session(sid, base, turn) == base + len(turn)
    assert _state(v, sid).tokens == PROMPT + turn and _kv_ok(v, sid)
    with pytest.raises(StaleRoundError, match="stale extension"):
        v.extend_session(sid, base, turn)
    r = v.verify(BlockRequest(session_id=sid, base_position=base + len(turn), draft_tokens=[]))
    assert r.next_token == TARGET.greedy(PROMPT + turn, 1)[0]


# -- bad input ------------------------------------------------------------------------------


def test_malformed_oversize_and_out_of_range_requests_are_invalid_and_others_keep_working():
    v = _verifier(max_message_bytes=64 * 1024)
    survivor = _open(v)
    sid, base = survivor.session_id, survivor.committed_length
    status = _raw(v, "Verify", b"\xff\xff\xff\xff not protobuf")
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in status.message
    big = pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=[5])
    big.hidden.data = bytes(100 * 1024)
    status = _raw(v, "Verify", big)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT and "exceeds the limit" in status.message
    with pytest.raises(ProtocolError, match="max_block"):
        v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5] * 9))
    with pytest.raises(ProtocolError, match="outside the vocabulary"):
        v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[10**7]))
    with pytest.raises(ProtocolError, match="outside the vocabulary"):
        v.extend_session(sid, base, [-1])
    status = _raw(v, "Verify", pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=[5],
                                                upload_protocol=7))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT and "upload protocol 7" in status.message
    status = _raw(v, "OpenSession", pb.OpenSessionRequest(prompt_tokens=PROMPT,
                                                          draft_tokenizer=fingerprint_to_pb(DRAFT.fingerprint())))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT and "ACCEPTANCE_MODE_UNSPECIFIED" in status.message
    # Nothing above touched the session: it verifies at the same base.
    verdict = v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5, 6]))
    assert verdict.committed_length == base + verdict.accepted + 1 and _kv_ok(v, sid)


def test_a_different_tokenizer_or_protocol_version_is_a_failed_precondition():
    v = _verifier()
    other = FakeDraftModel(ToyLanguageModel(48, name="small-vocab"))
    with pytest.raises(
        IncompatibleModelsError, match="'small-vocab' does not share a tokenizer with target model 'toy'"
    ):
        v.handshake(other.fingerprint(), draft_model="small-vocab", draft_hidden_size=8)
    with pytest.raises(IncompatibleModelsError):  # sessions check it again
        _open(v, draft=other.fingerprint())
    status = _raw(v, "Handshake", pb.HandshakeRequest(protocol_version=0))
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION and "protocol version 0" in status.message


# -- hidden states: FH and SH --------------------------------------------------------------

BLOCK = [9, 9, 9, 9]  # the toy target takes few of them


def _rows(k: int, d: int = 16) -> np.ndarray:
    return np.random.default_rng(k).normal(0, 1, (k, d)).astype(np.float32)


def _verify_raw(v, sid, base, tokens, upload, hidden=None, round_index=0):
    req = pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=tokens, upload_protocol=upload,
                           round_index=round_index)
    if hidden is not None:
        req.hidden.CopyFrom(hidden)
    return _raw(v, "Verify", req)


def _refused(answer, match: str) -> None:
    assert getattr(answer, "code", None) == grpc.StatusCode.INVALID_ARGUMENT, answer
    assert match in answer.message, answer.message


@pytest.mark.parametrize(
    "hidden, match",
    [
        (hidden_to_pb(encode_hidden(_rows(4, 8))), "8 wide; the session's draft model has 16"),
        (hidden_to_pb(encode_hidden(_rows(3))), "3 hidden-state rows sent; the round needs 4"),
        (pb.HiddenStates(encoding=1, count=4, dim=16, data=b"\0" * 100), "100 bytes; 4 rows of 16 need 128"),
        (pb.HiddenStates(encoding=0, count=4, dim=16, data=b"\0" * 128), "HIDDEN_ENCODING_UNSPECIFIED"),
        (pb.HiddenStates(encoding=2, count=4, dim=16, data=b"\0" * 64, scales=[1.0]), "one scale per row"),
        (None, "none were sent"),
    ],
)
def test_fh_states_that_do_not_fit_are_invalid_and_the_session_goes_on(hidden, match):
    v = _verifier()
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    _refused(_verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, hidden), match)
    r = _verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, hidden_to_pb(encode_hidden(_rows(4))))
    assert r.verdict.hidden_rows == 4 and r.verdict.committed_length > base
    positions, rows = _state(v, sid).last_hidden
    assert positions == (0, 1, 2, 3) and np.allclose(rows, _rows(4), rtol=2**-10)


def test_hidden_states_need_a_declared_width_and_an_upload_that_carries_them():
    v = _verifier()
    good = hidden_to_pb(encode_hidden(_rows(4)))
    opened = _open(v, draft_hidden_size=0)
    _refused(_verify_raw(v, opened.session_id, opened.committed_length, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, good),
             "without draft_hidden_size")
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    _refused(_verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_TOKENS_ONLY, good), "tokens-only round")
    _refused(_verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, good), "SH sends the tokens first")


def test_sh_asks_for_the_mismatches_then_takes_exactly_those():
    v = _verifier()
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    first = _verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, round_index=3)
    assert first.WhichOneof("result") == "hidden_request"
    positions = list(first.hidden_request.positions)
    context = list(PROMPT)
    expected = [i for i in range(4) if int(np.argmax(TARGET.logits(context + BLOCK[:i]))) != BLOCK[i]]
    assert positions == expected and positions
    again = _verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, round_index=3)
    assert again == first  # a retried first half: the same request, the block not run twice
    state = _state(v, sid)
    decoded = state.decoded

    def answer(rows_positions, round_index=3):
        h = hidden_to_pb(encode_hidden(_rows(len(rows_positions)), "fp16", tuple(rows_positions)))
        return _verify_raw(v, sid, base, [], pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, h, round_index)

    wrong = [p for p in range(len(BLOCK)) if p not in positions][:1] or positions[:-1] or [len(BLOCK)]
    _refused(answer(wrong), "the round needs")
    _refused(answer(positions, round_index=4), "did not ask about")
    verdict = answer(positions).verdict  # still pending after the refusals: the right answer lands
    assert verdict.hidden_rows == len(positions) and verdict.accepted == positions[0]
    assert state.decoded == decoded  # the second half reused the first half's target pass
    assert answer(positions).verdict == verdict  # a retried second half: the same verdict, applied once
    assert len(state.tokens) == verdict.committed_length and _kv_ok(v, sid)


def test_another_request_abandons_a_half_done_sh_round():
    v = _verifier()
    opened = _open(v)
    sid, base = opened.session_id, opened.committed_length
    first = _verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN)
    assert first.WhichOneof("result") == "hidden_request"
    assert v.service.engine.cached(_state(v, sid).seq) == base + len(BLOCK)  # the block waits in the KV
    # The device gives up on SH and sends the block tokens-only: the verdict is the one SH would have given.
    plain = _verify_raw(v, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_TOKENS_ONLY, round_index=1)
    assert plain.verdict.accepted == first.hidden_request.positions[0]
    state = _state(v, sid)
    assert state.pending is None and len(state.tokens) == plain.verdict.committed_length and _kv_ok(v, sid)
    assert state.tokens == PROMPT + TARGET.greedy(PROMPT, len(state.tokens) - len(PROMPT))


# -- the target-only baseline ----------------------------------------------------------------


def test_target_only_generation_is_the_targets_greedy_decoding_and_ends_as_it_says():
    v = _verifier()
    tokens = list(v.generate(GenerateRequest(PROMPT, "greedy", seed=0, max_tokens=12)))
    assert [t.token for t in tokens] == TARGET.greedy(PROMPT, 12)
    assert [t.finish_reason for t in tokens] == [None] * 11 + ["length"]
    assert len(v.service.sessions) == 0  # its session is gone with it
    ends = toy_verifier(ToyLanguageModel(seed=21, eos_bias=9.0))
    last = list(ends.generate(GenerateRequest(PROMPT, "greedy", seed=0, max_tokens=50)))[-1]
    assert (last.token, last.finish_reason) == (TARGET.eos, "eos")
    with pytest.raises(ProtocolError, match="max_tokens must be between 1 and 4096"):
        list(v.generate(GenerateRequest(PROMPT, "greedy", seed=0, max_tokens=0)))


# -- the scheduler seam and concurrency -------------------------------------------------------


class RecordingScheduler(FcfsScheduler):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[int, int, int]]] = []

    def schedule(self):
        batch = super().schedule()
        if batch is not None:
            self.batches.append([(f.seq, f.start, len(f.tokens)) for f in batch.feeds])
        return batch


def test_every_engine_run_goes_through_the_scheduler_with_its_timings():
    scheduler = RecordingScheduler()
    config = ServerConfig(port=0, max_sessions=2, max_context=64, max_block=8)
    v = InProcessTransport(VerifierService(ToyEngine(TARGET, n_seq=2, max_context=64), config, scheduler=scheduler))
    opened = _open(v)
    r = v.verify(BlockRequest(session_id=opened.session_id, base_position=opened.committed_length, draft_tokens=[5, 6]))
    seq = _state(v, opened.session_id).seq
    assert scheduler.batches == [[(seq, 0, len(PROMPT) - 1)], [(seq, len(PROMPT) - 1, 3)]]
    assert r.server.queue_ms >= 0 and r.server.verify_ms > 0


def test_concurrent_sessions_get_what_each_would_alone():
    v = _verifier(max_sessions=4)
    prompts = [DRAFT.tokenize(p) for p in ("one", "two words", "three little words", "four")]
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        opened = _open(v, prompt=prompts[i])
        base, out = opened.committed_length, []
        for _ in range(10):
            r = v.verify(BlockRequest(session_id=opened.session_id, base_position=base, draft_tokens=[7, 8]))
            out += [7, 8][: r.accepted] + [r.next_token]
            base = r.committed_length
        results[i] = out

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(prompts):
        assert results[i] == TARGET.greedy(p, len(results[i]))


# -- what gRPC adds ---------------------------------------------------------------------------

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def grpc_server():
    server = toy_server(TARGET, hidden_size=16, max_sessions=2, max_context=64, max_block=8,
                        max_message_bytes=64 * 1024, token=TOKEN).start()
    yield server
    server.stop()


def test_over_grpc_refusals_keep_their_status_auth_is_required_and_health_answers(grpc_server):
    with (
        GrpcTransport(grpc_server.address, ClientConfig(token="wrong", timeout=5)) as t,
        pytest.raises(AuthenticationError),
    ):
        t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=16)
    with GrpcTransport(grpc_server.address, ClientConfig(token=TOKEN, timeout=5)) as t:
        info = t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=16)
        assert (info.target_model, info.max_block, info.exact_numerics) == ("toy", 8, True) and t.health() == "SERVING"
        opened = t.open_session(OpenRequest(PROMPT, mode="greedy", seed=0,
                                draft=DRAFT.fingerprint(), draft_hidden_size=16))
        sid, base = opened.session_id, opened.committed_length
        first = t.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5]))
        with pytest.raises(StaleRoundError) as info:  # the committed length crosses gRPC in the trailers
            t.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[6]))
        assert info.value.committed_length == first.committed_length
        with pytest.raises(LimitExceededError, match="context limit") as limit:
            t.extend_session(sid, first.committed_length, [5] * 50)
        assert limit.value.code == "OUT_OF_RANGE"
        t.close_session(sid)
    with grpc.insecure_channel(grpc_server.address) as channel:
        call = channel.unary_unary("/edgekit.verifier.v1.Verifier/Verify")
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff not protobuf", timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.value.details()


def test_a_client_speculates_through_the_grpc_verifier_to_the_targets_own_decoding(grpc_server):
    config = GenerationConfig(max_tokens=30, drafting="fixed", draft_k=4, stop_at_eos=False)
    with EdgeClient(grpc_server.address, draft=DRAFT, generation=config,
                    config=ClientConfig(token=TOKEN, timeout=5)) as client:
        final = client.generate("hello there, general").until_done()
    assert list(final.token_ids) == TARGET.greedy(PROMPT, 30)
    assert final.stats.rounds < 30
