"""FH and SH on the real gemma pair through the real gRPC verifier: the output is
unchanged, the verifier receives the draft's hidden states, and what does not fit
the round is refused with INVALID_ARGUMENT, leaving the session usable."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from edgekit import EdgeClient, GenerationConfig
from edgekit.protocol import encode_hidden, fingerprint_to_pb, hidden_to_pb, pb
from edgekit.testing import Call, ScriptedTransport
from edgekit.transport import GrpcTransport

pytestmark = pytest.mark.models

PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def _generate(server, draft, upload: str, encoding: str = "fp16"):
    rounds = []  # every block sent, with the hidden states the (in-process) verifier decoded from it

    def record(call: Call) -> object:
        answer = call.forward()
        if call.method == "verify":
            block = call.arguments["block"]
            received = server.service.sessions.get(block.session_id).last_hidden
            rounds.append((block, received if answer.server.hidden_rows else None))
        return answer

    transport = ScriptedTransport(GrpcTransport(server.address), handler=record)
    config = GenerationConfig(
        max_tokens=40, drafting="fixed", draft_k=6, upload=upload, hidden_encoding=encoding, stop_at_eos=False
    )
    client = EdgeClient(transport, draft=draft, generation=config)
    session = client.session()  # kept open, so the verifier's side of it can be read
    session.open(client.tokenize(PROMPT))
    *_, final = session.stream()
    return final, rounds, session


@pytest.fixture(scope="module")
def tokens_only(gemma_server, gemma_draft):
    final, _, session = _generate(gemma_server, gemma_draft, "tokens")
    session.close()
    return final


@pytest.mark.parametrize("upload, encoding", [("fh", "fp16"), ("sh", "fp16"), ("fh", "int8")])
def test_hidden_uploads_change_nothing_in_the_output_and_arrive_intact(
    gemma_server, gemma_draft, tokens_only, upload, encoding
):
    result, rounds, session = _generate(gemma_server, gemma_draft, upload, encoding)
    assert result.token_ids == tokens_only.token_ids
    stats = result.stats
    assert stats.uploads == {upload: stats.rounds}
    if upload == "fh":
        assert stats.server.hidden_rows == stats.drafted and stats.exchanges == stats.rounds
    else:
        mismatched = sum(r.accepted < r.drafted for r in stats.rounds_detail)
        assert mismatched and stats.exchanges == stats.rounds + mismatched
        assert mismatched <= stats.server.hidden_rows < stats.drafted
    session.close()
    # What the verifier decoded in each round is the draft's hidden states, within the encoding's error.
    checked = 0
    for block, received in rounds:
        if received is None:
            continue
        positions, rows = received
        sent = block.hidden[list(positions)]
        assert rows.shape == (len(positions), gemma_draft.n_embd) and np.all(np.isfinite(sent))
        step = np.abs(sent).max(axis=1, keepdims=True) / 254 if encoding == "int8" else np.abs(sent) * 2.0**-11
        assert np.all(np.abs(rows - sent) <= step + 1e-6)
        checked += len(positions)
    assert checked == stats.server.hidden_rows
    # Distinct steps, distinct states: the rows are real hidden states, not a constant.
    block = max((b for b, _ in rounds), key=lambda b: len(b.draft_tokens))
    assert not np.allclose(block.hidden[0], block.hidden[-1])


# -- refusals on raw messages ---------------------------------------------------------


def _call(address: str, method: str, msg, reply):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/edgekit.verifier.v1.Verifier/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply.FromString,
        )
        return call(msg, timeout=20)


@pytest.fixture()
def opened(gemma_server, gemma_draft):
    sessions = []

    def open_(hidden_size: int = 640):
        r = _call(
            gemma_server.address,
            "OpenSession",
            pb.OpenSessionRequest(
                prompt_tokens=gemma_draft.tokenize("Hello there, general"),
                sampling=pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY),
                draft_tokenizer=fingerprint_to_pb(gemma_draft.fingerprint()),
                draft_hidden_size=hidden_size,
            ),
            pb.OpenSessionResponse,
        )
        sessions.append(r.session_id)
        return r.session_id, r.committed_length

    yield open_
    for sid in sessions:
        gemma_server.service.sessions.close(sid)


def _rows(k: int, d: int = 640) -> np.ndarray:
    return np.random.default_rng(k).normal(0, 1, (k, d)).astype(np.float32)


def _verify(address, sid, base, tokens, upload, hidden=None, round_index=0):
    req = pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=tokens, upload_protocol=upload,
                           round_index=round_index)
    if hidden is not None:
        req.hidden.CopyFrom(hidden)
    return _call(address, "Verify", req, pb.VerifyResponse)


def _refused(fn, match: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert match in info.value.details(), info.value.details()


BLOCK = [818, 5279, 563, 506]  # four ids; the target rejects some of them


@pytest.mark.parametrize(
    "hidden, match",
    [
        (hidden_to_pb(encode_hidden(_rows(4, 320))), "320 wide; the session's draft model has 640"),
        (hidden_to_pb(encode_hidden(_rows(3))), "3 hidden-state rows sent; the round needs 4"),
        (pb.HiddenStates(encoding=1, count=4, dim=640, data=b"\0" * 100), "100 bytes; 4 rows of 640 need 5120"),
        (pb.HiddenStates(encoding=0, count=4, dim=640, data=b"\0" * 5120), "HIDDEN_ENCODING_UNSPECIFIED"),
        (pb.HiddenStates(encoding=2, count=4, dim=640, data=b"\0" * 2560, scales=[1.0]), "one scale per row"),
    ],
)
def test_fh_states_that_do_not_fit_are_invalid_and_the_session_goes_on(gemma_server, opened, hidden, match):
    sid, base = opened()
    _refused(lambda: _verify(gemma_server.address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, hidden), match)
    good = hidden_to_pb(encode_hidden(_rows(4)))
    r = _verify(gemma_server.address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, good)
    assert r.verdict.hidden_rows == 4 and r.verdict.committed_length > base


def test_hidden_states_need_a_declared_width_and_an_upload_that_carries_them(gemma_server, opened):
    good = hidden_to_pb(encode_hidden(_rows(4)))
    sid, base = opened(hidden_size=0)
    _refused(lambda: _verify(gemma_server.address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_FULL_HIDDEN, good),
             "without draft_hidden_size")
    sid, base = opened()
    _refused(lambda: _verify(gemma_server.address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_TOKENS_ONLY, good),
             "tokens-only round")
    _refused(lambda: _verify(gemma_server.address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, good),
             "SH sends the tokens first")


def test_sh_asks_for_the_mismatches_then_takes_exactly_those(gemma_server, opened):
    address = gemma_server.address
    sid, base = opened()
    first = _verify(address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, round_index=3)
    assert first.WhichOneof("result") == "hidden_request"
    positions = list(first.hidden_request.positions)
    assert positions and positions == sorted(positions) and positions[-1] < len(BLOCK)
    again = _verify(address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, round_index=3)
    assert again == first  # a retried first half: the same request, the block not run twice
    state = gemma_server.service.sessions.get(sid)
    decoded = state.decoded

    def answer(rows_positions, round_index=3):
        h = hidden_to_pb(encode_hidden(_rows(len(rows_positions)), "fp16", tuple(rows_positions)))
        return _verify(address, sid, base, [], pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN, h, round_index)

    wrong = [p for p in range(len(BLOCK)) if p not in positions][:1] or positions[:-1] or [len(BLOCK)]
    _refused(lambda: answer(wrong), "the round needs")
    _refused(lambda: answer(positions, round_index=4), "did not ask about")
    verdict = answer(positions).verdict  # still pending after the refusals: the right answer lands
    assert verdict.hidden_rows == len(positions) and verdict.accepted == positions[0]
    assert state.decoded == decoded  # the second half reused the first half's target pass
    assert answer(positions).verdict == verdict  # a retried second half: the same verdict, applied once
    assert len(state.tokens) == verdict.committed_length


def test_another_request_abandons_a_half_done_sh_round(gemma_server, opened, gemma_draft):
    address = gemma_server.address
    sid, base = opened()
    first = _verify(address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN)
    assert first.WhichOneof("result") == "hidden_request"
    # The device gives up on SH and sends the block tokens-only: the verdict is the one SH would have given.
    plain = _verify(address, sid, base, BLOCK, pb.UPLOAD_PROTOCOL_TOKENS_ONLY, round_index=1)
    assert plain.verdict.accepted == first.hidden_request.positions[0]
    state = gemma_server.service.sessions.get(sid)
    assert state.pending is None and len(state.tokens) == plain.verdict.committed_length
    # and the session decodes on from there as target-only decoding would
    ref_tokens = gemma_draft.tokenize("Hello there, general")
    assert state.tokens[: len(ref_tokens)] == ref_tokens
