"""Generation that survives losing its verifier, on the toy verifier: a lost verdict
re-sent and applied once, a restarted verifier that gets the session reopened, a
verifier that now serves another target refused, errors that are not retried, and
the back-off's delays. The kill-and-restart test over real gRPC is in
tests/integration/test_resume_grpc.py."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

import pytest

from edgekit import (
    AuthenticationError,
    ClientConfig,
    EdgeClient,
    FinalStats,
    IncompatibleModelsError,
    LimitExceededError,
    Resumed,
    VerifierUnavailableError,
)
from edgekit.client._resilience import Backoff, retryable
from edgekit.errors import ProtocolError, SessionNotFoundError
from edgekit.protocol import BlockRequest, LinkState, OpenRequest, VerifyResult
from edgekit.testing import Call, FakeDraftModel, ScriptedTransport, ToyLanguageModel, faults, toy_client, toy_verifier

FAST = ClientConfig(retry_for=5.0, retry_initial=0.001, retry_max=0.002)


TARGET = ToyLanguageModel(seed=3, eos_bias=-4.0)


def _restart(target: ToyLanguageModel = TARGET) -> Callable[[Call], VerifyResult]:
    """A scripted fault: the verifier restarts (serving `target`), losing its sessions, and the
    request never arrives."""

    def restart(call: Call) -> VerifyResult:
        call.transport.inner = toy_verifier(target)
        raise VerifierUnavailableError("restarting", address=call.transport.address)

    return restart


def _client(plan: dict[int, object], *, config: ClientConfig = FAST, **gen) -> tuple[EdgeClient, ScriptedTransport]:
    """A client of the toy verifier whose n-th Verify does what `plan[n]` says (a `ScriptedTransport`
    fault: "lose", "drop", `_restart()`, an exception)."""
    transport = ScriptedTransport(toy_verifier(TARGET), handler=faults({"verify": plan}), config=config)
    gen = {"draft_k": 4, "max_tokens": 60, "stop_at_eos": False} | gen
    return toy_client(TARGET, noise=1.5, verifier=transport, config=config, **gen), transport


def _events(client: EdgeClient, prompt: str) -> tuple[list, list[int]]:
    """A generation's events, and the tokens the verifier's session holds at its end."""
    session = client.session()
    session.open(client.tokenize(prompt))
    events = list(session.stream())
    server = client.transport.inner.service.sessions.get(session.session_id)
    return events, server.tokens


def _reference(prompt: str) -> tuple[int, ...]:
    client, _ = _client({})
    return client.generate_target_only(prompt).until_done().token_ids


@pytest.mark.parametrize("failure", ["lose", "drop"])
def test_a_round_that_fails_is_resent_and_applied_once(failure):
    client, _ = _client({3: failure, 7: failure, 8: failure})
    events, held = _events(client, "resume me")
    final = events[-1]
    assert isinstance(final, FinalStats)
    assert final.token_ids == _reference("resume me")  # nothing lost, nothing applied twice
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert [r.attempts for r in resumed] == [1, 2]
    assert all(r.reprefilled_tokens == 0 and r.causes == ("VerifierUnavailableError",) for r in resumed)
    assert final.stats.outages == 2 and final.stats.reprefilled_tokens == 0
    # The verifier applied each round once: its session holds what the client committed.
    assert held == client.tokenize("resume me") + list(final.token_ids)


def test_a_restarted_verifier_gets_the_session_reopened_from_the_committed_tokens():
    client, _ = _client({4: _restart()})
    events, held = _events(client, "a verifier that restarts")
    final = events[-1]
    assert final.token_ids == _reference("a verifier that restarts")
    assert held == client.tokenize("a verifier that restarts") + list(final.token_ids)
    (resumed,) = [e for e in events if isinstance(e, Resumed)]
    assert resumed.causes == ("VerifierUnavailableError", "SessionNotFoundError")
    # It prefilled what was committed before the restart: the prompt and three rounds' tokens.
    deltas_before = sum(e.stats.committed for e in events[: events.index(resumed)] if e.type == "round")
    assert resumed.reprefilled_tokens == len(client.tokenize("a verifier that restarts")) + deltas_before


def test_a_verifier_that_comes_back_with_another_target_is_refused():
    client, _ = _client({2: _restart(ToyLanguageModel(seed=3, eos_bias=-4.0, name="another-target"))})
    with pytest.raises(IncompatibleModelsError, match="another-target"):
        client.generate("which target?").until_done()


def test_a_session_survives_a_failed_round_when_nothing_retries():
    config = ClientConfig(retry_for=0)
    client, transport = _client({3: "lose"}, config=config)
    session = client.session()
    session.open(client.tokenize("no retries"))
    committed = []
    for _ in range(2):
        committed += session.round(4)[0]
    with pytest.raises(VerifierUnavailableError):
        session.round(4)  # the verifier applied it; its verdict was lost
    # The draft holds the committed tokens and the block in flight, nothing else: it is re-sent as it was.
    assert client.draft.evaluated == session.drafter.sequence()[: client.draft.n_past]
    assert session.drafter.chain.tokens == list(session.rounds.inflight.request.draft_tokens)
    for _ in range(5):  # the next round re-sends the lost one, and the session goes on in step
        committed += session.round(4)[0]
    (sess,) = transport.inner.service.sessions._sessions.values()
    assert sess.tokens == session.tokens
    reference = _reference("no retries")
    assert committed == list(reference[: len(committed)])


@pytest.mark.parametrize(
    "error",
    [
        AuthenticationError("no", address="x"),
        ProtocolError("malformed", address="x"),
        LimitExceededError("block too long", address="x"),  # no retry hint: a limit, not a full queue
    ],
)
def test_errors_that_would_come_back_the_same_are_not_retried(error):
    client, transport = _client({2: error})
    with pytest.raises(type(error)) as info:
        client.generate("final").until_done()
    assert info.value is error and transport.count("verify") == 2


def test_an_outage_longer_than_retry_for_ends_the_answer_saying_how_long_it_tried():
    config = ClientConfig(retry_for=0.05, retry_initial=0.01, retry_max=0.01)
    client, transport = _client({n: "drop" for n in range(2, 100)}, config=config)
    with pytest.raises(VerifierUnavailableError) as info:
        client.generate("gone for good").until_done()
    assert 2 <= transport.count("verify") <= 12
    if sys.version_info >= (3, 11):  # notes on exceptions came with 3.11
        assert any("tried again" in note for note in info.value.__notes__)


def test_back_off_doubles_with_jitter_honours_the_verifiers_hint_and_stops_in_time():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    config = ClientConfig(retry_for=10.0, retry_initial=0.1, retry_max=1.0)
    b = Backoff(config, clock=lambda: now[0], sleep=sleep, rng=random.Random(0))
    lost = VerifierUnavailableError("down")
    with pytest.raises(VerifierUnavailableError):
        while True:
            b.wait(lost)
    for i, s in enumerate(slept):
        step = min(1.0, 0.1 * 2**i)
        assert step / 2 <= s <= step
    assert sum(slept) <= 10.0 and sum(slept) + 1.0 > 10.0 - 1.0  # it used the time it had
    full = LimitExceededError("queue full", retry_after=2.5)
    assert Backoff(config, rng=random.Random(0)).delay(full) == 2.5
    assert retryable(full) and retryable(SessionNotFoundError("gone")) and retryable(lost)
    assert not retryable(LimitExceededError("context")) and not retryable(ProtocolError("bad"))


def test_a_retry_is_known_by_what_decides_its_verdict_not_by_the_link_figures_it_carries():
    transport = toy_verifier(TARGET)
    draft = FakeDraftModel(ToyLanguageModel(seed=3, noise=1.5))
    opened = transport.open_session(
        OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=draft.fingerprint())
    )
    block = BlockRequest(opened.session_id, 3, [4, 5, 6], link=LinkState(rtt_ms=20.0), draft_ms=3.0, network_ms=20.0)
    first = transport.verify(block)
    again = transport.verify(
        BlockRequest(opened.session_id, 3, [4, 5, 6], link=LinkState(rtt_ms=90.0), draft_ms=7.0, network_ms=85.0)
    )
    assert (again.accepted, again.next_token, again.committed_length) == (
        first.accepted, first.next_token, first.committed_length,
    )
    (sess,) = transport.service.sessions._sessions.values()
    assert len(sess.tokens) == first.committed_length  # applied once


def test_generate_json_keeps_what_came_before_the_verifier_died(monkeypatch):
    import json
    from textwrap import dedent

    from typer.testing import CliRunner

    from edgekit.cli import _connect  # private: where the CLI builds its client, swapped for a toy one
    from edgekit.cli.app import app

    def build_client(*, generation, retry_for=None, **_):
        client, _transport = _client({4: VerifierUnavailableError("gone", address="in-process")},
                                     config=ClientConfig(retry_for=retry_for or 0.0, first_route="speculative"))
        client.generation = generation
        return client

    monkeypatch.setattr(_connect, "build_client", build_client)
    result = CliRunner().invoke(app, ["generate", "-p", "partial", "--json", "-n", "40", "--retry-for", "0"])
    assert result.exit_code == 1 and result.stderr == ""
    assert result.stdout == dedent("""\
        {
          "pair": "gemma-270m",
          "verifier": null,
          "prompt": "partial",
          "token_ids": [
            27,
            30,
            40,
            54
          ],
          "text": "beoc",
          "finish_reason": "error",
          "error": {
            "type": "VerifierUnavailableError",
            "message": "gone"
          },
          "outages": []
        }
        """)
    assert isinstance(result.exception, VerifierUnavailableError)  # main() says it on stderr, as one line
    # three rounds committed at least one token each: what target-only decoding begins with
    assert tuple(json.loads(result.stdout)["token_ids"]) == _reference("partial")[:4]


def test_a_lost_verifier_fails_over_to_the_next_serving_the_same_target():
    from edgekit.transport import FailoverTransport

    gone = faults({"verify": {n: "drop" for n in range(4, 1000)}})
    first = ScriptedTransport(toy_verifier(TARGET), handler=gone, config=FAST)
    second = toy_verifier(TARGET, address="second")
    transport = FailoverTransport([first, second], FAST)
    client = toy_client(TARGET, noise=1.5, verifier=transport, config=FAST, draft_k=4, max_tokens=60, stop_at_eos=False)
    events = list(client.generate("fail over"))
    assert events[-1].token_ids == _reference("fail over")
    (resumed,) = [e for e in events if isinstance(e, Resumed)]
    assert resumed.causes == ("VerifierUnavailableError", "SessionNotFoundError") and resumed.reprefilled_tokens > 0
    assert transport.address == "second" and len(second.verify_calls) > 0


def test_failover_never_uses_a_verifier_of_another_target():
    from edgekit.transport import FailoverTransport

    brief = ClientConfig(retry_for=0.3, retry_initial=0.01, retry_max=0.02)
    down = {n: "drop" for n in range(2, 10**6)}
    first = ScriptedTransport(toy_verifier(TARGET), handler=faults({"verify": down}), config=brief)
    other = toy_verifier(ToyLanguageModel(seed=3, eos_bias=-4.0, name="another-target"), address="other")
    transport = FailoverTransport([first, other], brief)
    client = toy_client(TARGET, noise=1.5, verifier=transport, config=brief, max_tokens=40, stop_at_eos=False)
    with pytest.raises(VerifierUnavailableError):
        client.generate("stay on target").until_done()  # the first stays down; the other is never an option
    assert not other.verify_calls and other.service.sessions.evictions == 0 and len(other.service.sessions) == 0
    assert "another-target" in transport._refused[1]
