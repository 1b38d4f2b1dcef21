"""The test kit itself (edgekit.testing): `ScriptedTransport`'s faults, handler, forwarding,
recorded calls and attributes, and `toy_client`'s set-up."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from edgekit import GenerationConfig, VerifierUnavailableError
from edgekit.errors import LimitExceededError, SessionNotFoundError
from edgekit.protocol import BlockRequest, GenerateRequest, OpenRequest
from edgekit.runtime import DraftPool
from edgekit.testing import (
    Call,
    FakeDraftModel,
    ScriptedTransport,
    ToyLanguageModel,
    ToyPoolBackend,
    faults,
    toy_client,
    toy_verifier,
)

TARGET = ToyLanguageModel(seed=7)
DRAFT = FakeDraftModel(TARGET)


def _opened(transport: ScriptedTransport) -> tuple[str, int]:
    """A session on [1, 2, 3]: its id and committed length."""
    opened = transport.open_session(OpenRequest([1, 2, 3], mode="greedy", seed=0,
                                                draft=DRAFT.fingerprint()))
    return opened.session_id, opened.committed_length


def _held(transport: ScriptedTransport, session_id: str) -> list[int]:
    return list(transport.inner.service.sessions.get(session_id).tokens)  # type: ignore[union-attr]


def _block(session_id: str, base: int) -> BlockRequest:
    """A block of the target's own next three tokens (all accepted)."""
    return BlockRequest(session_id, base, TARGET.greedy([1, 2, 3], 3))


# -- the script ------------------------------------------------------------------------------


def test_a_dropped_request_never_arrives():
    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"verify": {1: "drop"}}))
    sid, base = _opened(transport)
    with pytest.raises(VerifierUnavailableError, match="verify call 1 .* dropped") as info:
        transport.verify(_block(sid, base))
    assert info.value.address == "in-process"
    assert transport.inner.verify_calls == [] and _held(transport, sid) == [1, 2, 3]  # nothing applied
    verdict = transport.verify(_block(sid, base))  # the second is not scripted: it arrives
    assert verdict.accepted == 3 and _held(transport, sid) == [1, 2, 3, *TARGET.greedy([1, 2, 3], 4)]


def test_a_lost_answer_was_applied():
    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"verify": {1: "lose"}}))
    sid, base = _opened(transport)
    with pytest.raises(VerifierUnavailableError, match="answer to verify call 1 .* was lost"):
        transport.verify(_block(sid, base))
    assert len(transport.inner.verify_calls) == 1
    assert _held(transport, sid) == [1, 2, 3, *TARGET.greedy([1, 2, 3], 4)]  # applied: the verdict is what was lost


def test_a_scripted_error_is_raised_instead_of_the_call():
    error = LimitExceededError("block too long", address="x")
    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"verify": {2: error}}))
    sid, base = _opened(transport)
    first = transport.verify(_block(sid, base))
    with pytest.raises(LimitExceededError) as info:
        transport.verify(_block(sid, first.committed_length))
    assert info.value is error and len(transport.inner.verify_calls) == 1


def test_a_scripted_function_answers_its_call():
    seen: list[Call] = []

    def answer(call: Call) -> float:
        seen.append(call)
        return 42.0

    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"ping": {2: answer}}))
    assert transport.ping() >= 0.0  # the first ping is forwarded: its round trip
    assert transport.ping(16, reply_bytes=8) == 42.0
    (call,) = seen
    assert (call.method, call.n, call.arguments) == ("ping", 2, {"payload_bytes": 16, "reply_bytes": 8})
    assert call.transport is transport and str(call) == "ping call 2"


def test_a_script_names_calls_and_faults_that_exist():
    with pytest.raises(ValueError, match="no transport call 'verfy'"):
        ScriptedTransport(handler=faults({"verfy": {1: "drop"}}))
    with pytest.raises(ValueError, match="'vanish' is no fault"):
        ScriptedTransport(handler=faults({"verify": {1: "vanish"}}))  # type: ignore[dict-item]


# -- the handler and forwarding -----------------------------------------------------------------


def test_a_handler_answers_every_call_the_script_leaves_without_an_inner_transport():
    def handler(call: Call) -> float:
        if call.arguments["payload_bytes"]:
            raise VerifierUnavailableError("no answer within 2 s")
        return 8.0

    transport = ScriptedTransport(handler=faults({"ping": {3: "drop"}}, handler))
    assert transport.ping() == 8.0
    with pytest.raises(VerifierUnavailableError, match="within 2 s"):
        transport.ping(payload_bytes=1024)
    with pytest.raises(VerifierUnavailableError, match="dropped"):
        transport.ping()  # the script comes first
    assert [(c.method, c.n) for c in transport.calls] == [("ping", 1), ("ping", 2), ("ping", 3)]
    assert transport.address == "scripted"


def test_without_a_handler_or_an_inner_transport_a_call_says_so():
    with pytest.raises(RuntimeError, match="cannot forward verify call 1"):
        ScriptedTransport().verify(BlockRequest("s", 0, [1]))


def test_a_handler_can_forward_swap_the_inner_transport_and_hold_a_call_until_an_event():
    first, second = toy_verifier(TARGET), toy_verifier(TARGET, address="second")
    release = threading.Event()
    held: list[int] = []

    def handler(call: Call):  # type: ignore[no-untyped-def]
        if call.method == "verify" and call.n == 2:
            held.append(call.n)
            assert release.wait(30), "the test never released the call"
            call.transport.inner = second  # a verifier that restarts elsewhere: its sessions are gone
        return call.forward()

    transport = ScriptedTransport(first, handler=handler)
    sid, base = _opened(transport)
    verdict = transport.verify(_block(sid, base))
    errors: list[Exception] = []

    def verify_again() -> None:
        try:
            transport.verify(_block(sid, verdict.committed_length))
        except Exception as exc:  # the thread hands its error to the test
            errors.append(exc)

    thread = threading.Thread(target=verify_again)
    thread.start()
    release.set()
    thread.join(30)
    assert held == [2] and transport.inner is second
    assert isinstance(errors[0], SessionNotFoundError)  # forwarded to the new verifier
    assert len(first.verify_calls) == 1 and len(second.verify_calls) == 1


def test_a_stream_is_scripted_when_read_and_a_lost_one_ran_to_its_end():
    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"generate": {2: "lose", 3: "drop"}}))
    tokens = [t.token for t in transport.generate(GenerateRequest([1, 2, 3], "greedy", seed=0, max_tokens=4))]
    assert tokens == TARGET.greedy([1, 2, 3], 4)
    lost = transport.generate(GenerateRequest([1, 2, 3], "greedy", seed=0, max_tokens=4))
    assert transport.count("generate") == 1  # nothing sent until the stream is read, as over gRPC
    with pytest.raises(VerifierUnavailableError, match="lost"):
        next(lost)
    with pytest.raises(VerifierUnavailableError, match="dropped"):
        list(transport.generate(GenerateRequest([1, 2, 3], "greedy", seed=0, max_tokens=4)))
    assert transport.count("generate") == 3


# -- what it records and what it passes on ----------------------------------------------------


def test_every_call_is_recorded_with_its_arguments_and_counted_per_method():
    transport = ScriptedTransport(toy_verifier(TARGET))
    client = toy_client(TARGET, verifier=transport, max_tokens=12, stop_at_eos=False)
    final = client.generate([1, 2, 3]).until_done()
    assert list(final.token_ids) == TARGET.greedy([1, 2, 3], 12)
    methods = [c.method for c in transport.calls]
    assert methods[:2] == ["handshake", "open_session"] and methods[-1] == "close_session"
    verifies = [c for c in transport.calls if c.method == "verify"]
    assert [c.n for c in verifies] == list(range(1, len(verifies) + 1)) == list(range(1, transport.count("verify") + 1))
    assert [c.arguments["block"] for c in verifies] == transport.inner.verify_calls  # forwarded as they came
    assert list(transport.calls[1].arguments["request"].prompt_tokens) == [1, 2, 3]
    assert transport.count("ping") == 0


def test_it_forwards_nothing_implicitly_but_takes_its_inner_transports_address_and_config():
    inner = toy_verifier(TARGET, address="toy:1")
    transport = ScriptedTransport(inner)
    for name in ("service", "verify_calls", "nothing_here"):  # what a test reads of the verifier, it reads of inner
        with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
            getattr(transport, name)
    assert transport.inner is inner and transport.address == "toy:1" and transport.config is inner.config
    given = ScriptedTransport(inner, address="elsewhere", config=inner.config)
    assert given.address == "elsewhere"


# -- toy_client -------------------------------------------------------------------------------


def test_toy_client_drafts_with_a_noisy_copy_of_its_target_and_takes_generation_fields():
    target = ToyLanguageModel(seed=4, eos_bias=-8.0, order=1)
    client = toy_client(target, noise=1.5, generation=GenerationConfig(max_tokens=9), draft_k=3, stop_at_eos=False)
    lm = client.draft.lm  # type: ignore[attr-defined]
    assert (lm.seed, lm.eos_bias, lm.order, lm.noise, lm.name) == (4, -8.0, 1, 1.5, target.name)
    assert (client.generation.max_tokens, client.generation.draft_k, client.generation.stop_at_eos) == (9, 3, False)
    assert list(client.generate([1, 2]).until_done().token_ids) == target.greedy([1, 2], 9)
    assert client.transport.service.engine.lm is target  # type: ignore[attr-defined]


def test_toy_client_takes_a_draft_a_draft_model_or_a_pool():
    other = ToyLanguageModel(seed=4, noise=50.0)
    assert toy_client(TARGET, draft=other).draft.lm is other  # type: ignore[attr-defined]
    fake = FakeDraftModel(TARGET, n_embd=16)
    assert toy_client(TARGET, draft=fake).draft is fake
    pool = DraftPool(ToyPoolBackend(TARGET, slots=2))
    with toy_client(TARGET, draft=pool, max_tokens=6) as client:
        assert [list(r.token_ids) for r in client.generate_many([[1, 2], [3]])] == [
            TARGET.greedy([1, 2], 6), TARGET.greedy([3], 6),
        ]


def test_the_kit_loads_the_verifier_only_when_a_toy_verifier_is_asked_for():
    """A test of code built on edgekit that scripts a transport or fakes a draft does not pay for
    importing the verifier (grpc's server side, the engines, the schedulers)."""
    probe = ("import sys, edgekit.testing as kit; before = 'edgekit.verifier' in sys.modules; kit.toy_verifier; "
             "print(before, 'edgekit.verifier' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["False", "True"]), done.stderr
