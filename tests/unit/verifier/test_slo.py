"""Token-speed SLOs end to end over the toy verifier: the protocol version agreed at
the handshake, classes and speeds refused or accepted, each round's budget (WISP
eq. 6) and whether it was met in the verdict, the client's report of its drafting
and link time, and back-off hints on a full verifier."""

from __future__ import annotations

import math
import threading

import grpc
import numpy as np
import pytest
from _wait import until

import edgekit.verifier._validation as validation
from edgekit import ConfigError, LimitExceededError, ProtocolError
from edgekit.protocol import (
    GREEDY,
    RETRY_AFTER_MS_KEY,
    BlockRequest,
    GenerateRequest,
    OpenRequest,
    SpeedObjective,
    error_from_status,
    fingerprint_to_pb,
    pb,
    sampling_to_pb,
    status_of,
)
from edgekit.testing import FakeDraftModel, InProcessTransport, ToyLanguageModel, toy_client, toy_server, toy_verifier
from edgekit.verifier import EngineCore, FcfsScheduler, Feed, ToyEngine

TARGET = ToyLanguageModel(seed=5)
DRAFT = FakeDraftModel(ToyLanguageModel(seed=5, noise=2.0), n_embd=8)
PROMPT = DRAFT.tokenize("a prompt for the toy target")


def _verifier(**config) -> InProcessTransport:
    return toy_verifier(TARGET, **({"max_block": 8, "max_context": 256, "max_sessions": 4} | config))


def _open(v: InProcessTransport, slo: SpeedObjective = SpeedObjective()):
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    return v.open_session(
        OpenRequest(PROMPT, mode="greedy", seed=0, slo=slo, draft=DRAFT.fingerprint())
    )


def _raw(v: InProcessTransport, method: str, msg):
    try:
        return v.service.call(method, msg.SerializeToString())
    except Exception as exc:
        return status_of(exc)


# -- the handshake agrees on a version ---------------------------------------------------


@pytest.mark.parametrize(("asked", "agreed", "has_classes"), [(1, 1, False), (2, 2, True), (99, 2, True)])
def test_the_handshake_answers_with_the_version_both_speak(asked, agreed, has_classes):
    v = _verifier()
    r = v.service.call("Handshake", pb.HandshakeRequest(
        protocol_version=asked, draft_tokenizer=fingerprint_to_pb(DRAFT.fingerprint())).SerializeToString())
    assert r.protocol_version == agreed
    # A version 1 peer hears nothing of version 2.
    assert dict(r.capabilities.slo_classes) == ({"realtime": 8.0, "interactive": 6.0, "standard": 4.0,
                                                  "relaxed": 2.0} if has_classes else {})
    assert r.capabilities.scheduling_policy == ("fcfs" if has_classes else "")


def test_the_client_sees_the_classes_and_the_policy():
    v = _verifier(policy="wisp", slo_classes="chat=5,bulk=1.5")
    info = v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    assert info.protocol_version == 2 and info.slo_classes == {"chat": 5.0, "bulk": 1.5}
    assert info.scheduling_policy == "wisp"


def test_an_slo_to_a_version_1_verifier_is_refused_before_anything_is_sent(monkeypatch):
    monkeypatch.setattr(validation, "PROTOCOL_VERSION", 1)
    v = _verifier()
    assert v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8).protocol_version == 1
    with pytest.raises(ConfigError, match="protocol version 1, which has no token-speed SLOs"):
        v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, slo=SpeedObjective("standard"),
                       draft=DRAFT.fingerprint()))
    assert len(v.service.sessions) == 0
    # Best effort works, and rounds carry no version 2 field.
    opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
    sent: list[pb.VerifyRequest] = []
    call = v.service.call
    v.service.call = lambda m, raw, d=None: (sent.append(pb.VerifyRequest.FromString(raw)) if m == "Verify" else None,
                                            call(m, raw, d))[1]
    v.verify(BlockRequest(opened.session_id, opened.committed_length, [3, 4], draft_ms=12.0, network_ms=3.0))
    assert (sent[0].draft_ms, sent[0].network_ms) == (0.0, 0.0)


# -- classes and speeds ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "speed", "message"), [
    ("turbo", 0.0, "unknown SLO class 'turbo'; this verifier serves realtime (8 tok/s)"),
    ("", -2.0, "must be a positive number of tokens/s, got -2.0"),
    ("standard", math.nan, "must be a positive number of tokens/s, got nan"),
    ("", math.inf, "must be a positive number of tokens/s, got inf"),
])
def test_an_unknown_class_or_a_bad_speed_is_invalid_argument(name, speed, message):
    v = _verifier()
    for method, msg in (
        ("OpenSession", pb.OpenSessionRequest(prompt_tokens=PROMPT, sampling=sampling_to_pb("greedy", GREEDY, 0),
                                              draft_tokenizer=fingerprint_to_pb(DRAFT.fingerprint()),
                                              slo_name=name, target_tokens_per_s=speed)),
        ("Generate", pb.GenerateRequest(prompt_tokens=PROMPT, sampling=sampling_to_pb("greedy", GREEDY, 0),
                                        max_tokens=3,
                                        slo_name=name, target_tokens_per_s=speed)),
    ):
        if method == "Generate":
            with pytest.raises(ProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")):
                list(v.service.call_stream(method, msg.SerializeToString()))
        else:
            status = _raw(v, method, msg)
            assert status.code == grpc.StatusCode.INVALID_ARGUMENT and message in status.message
    assert len(v.service.sessions) == 0  # nothing was opened


def test_a_speed_wins_over_a_class_and_the_session_says_what_it_is_held_to():
    v = _verifier()
    assert _open(v, SpeedObjective("relaxed")).target_speed == 2.0
    assert _open(v, SpeedObjective("relaxed", 7.5)).target_speed == 7.5
    assert _open(v, SpeedObjective("best-effort")).target_speed == 0.0
    assert _open(v).target_speed == 0.0


def test_bad_round_times_are_invalid_argument():
    v = _verifier()
    opened = _open(v, SpeedObjective("standard"))
    for draft_ms, network_ms in ((-1.0, 0.0), (0.0, math.nan)):
        with pytest.raises(ProtocolError, match="must be a non-negative number of ms"):
            v.verify(BlockRequest(opened.session_id, opened.committed_length, [3], draft_ms=draft_ms,
                                  network_ms=network_ms))


# -- budgets and deadlines ---------------------------------------------------------------


def test_each_round_gets_the_budget_of_eq_6_and_says_whether_it_was_met():
    v = _verifier()
    opened = _open(v, SpeedObjective("standard"))  # 4 tok/s
    sid, base = opened.session_id, opened.committed_length
    # alpha starts at 0.5: 4 drafts are worth 0.5 * 4 + 1 = 3 tokens, i.e. 750 ms at 4 tok/s.
    first = v.verify(BlockRequest(sid, base, [3, 4, 5, 6], draft_ms=100.0, network_ms=50.0))
    assert first.server.budget_ms == pytest.approx(750.0 - 150.0)
    assert first.server.deadline_met is True  # the toy verifies in well under 600 ms
    # The session's acceptance moves toward this round's (smoothing 0.3), and the budget with it.
    alpha = 0.7 * 0.5 + 0.3 * first.accepted / 4
    base = first.committed_length
    second = v.verify(BlockRequest(sid, base, [3, 4], draft_ms=0.0, network_ms=0.0))
    assert second.server.budget_ms == pytest.approx((alpha * 2 + 1) / 4 * 1e3)
    # A device that spent the whole budget drafting: the deadline is missed and the verdict says so.
    third = v.verify(BlockRequest(sid, second.committed_length, [3], draft_ms=5000.0, network_ms=0.0))
    assert third.server.budget_ms < 0 and third.server.deadline_met is False
    # An exact retry gets the same answer, budget and all.
    again = v.verify(BlockRequest(sid, second.committed_length, [3], draft_ms=5000.0, network_ms=0.0))
    assert (again.server.budget_ms, again.server.deadline_met, again.committed_length) == (
        third.server.budget_ms, third.server.deadline_met, third.committed_length)


def test_best_effort_rounds_have_no_budget():
    v = _verifier()
    opened = _open(v)
    r = v.verify(BlockRequest(opened.session_id, opened.committed_length, [3, 4], draft_ms=10.0, network_ms=10.0))
    assert r.server.budget_ms is None and r.server.deadline_met is None


def test_the_client_reports_its_drafting_and_link_time_and_counts_missed_deadlines():
    v = _verifier()
    with toy_client(TARGET, noise=2.0, verifier=v, max_tokens=24, slo_class="interactive", drafting="fixed", draft_k=3,
                    stop_at_eos=False) as client:
        result = client.generate(PROMPT).until_done()
    sent = v.verify_calls
    assert len(sent) >= 2 and all(b.draft_ms > 0 for b in sent)
    # The first round has no link time yet but the probe's RTT (none here); later ones the last round's.
    assert all(b.network_ms >= 0 for b in sent)
    stats = result.stats
    assert stats.target_speed == 6.0
    rounds = stats.rounds_detail
    assert all(r.server.budget_ms is not None and r.server.deadline_met is not None for r in rounds)
    assert stats.deadlines_missed == sum(not r.server.deadline_met for r in rounds)


def test_generate_with_a_speed_runs_and_a_best_effort_one_too():
    v = _verifier()
    req = pb.GenerateRequest(prompt_tokens=PROMPT, sampling=sampling_to_pb("greedy", GREEDY, 0), max_tokens=4,
                             slo_name="realtime")
    with_slo = [m.token for m in v.service.call_stream("Generate", req.SerializeToString())]
    req.slo_name = ""
    assert [m.token for m in v.service.call_stream("Generate", req.SerializeToString())] == with_slo


# -- back-off hints ----------------------------------------------------------------------


def test_a_full_session_table_says_when_to_try_again():
    v = _verifier(max_sessions=1, idle_timeout=30.0)
    _open(v)
    with pytest.raises(LimitExceededError, match="maximum of 1 sessions; try again in") as err:
        _open(v)
    assert 1.0 <= err.value.retry_after <= 30.0
    # On the wire the hint rides in a trailer, and the client reads it back.
    status = status_of(err.value)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    ((key, value),) = status.trailers
    assert key == RETRY_AFTER_MS_KEY and float(value) == pytest.approx(err.value.retry_after * 1e3, abs=1)
    back = error_from_status(status.code, status.message, status.trailers, address="a", during="opening")
    assert isinstance(back, LimitExceededError) and back.retry_after == pytest.approx(err.value.retry_after, abs=1e-3)


def test_a_full_queue_is_refused_with_a_back_off_and_never_stalls_the_engine():
    gate, running = threading.Event(), threading.Event()
    engine = ToyEngine(TARGET, n_seq=4, max_context=64)
    real = engine.run_batch

    def held(feeds):
        running.set()
        assert gate.wait(30)
        return real(feeds)

    engine.run_batch = held
    core = EngineCore(engine, FcfsScheduler(max_works=1, max_queue=1))
    results: list = []

    def call(seq: int) -> None:
        results.append(core.run(Feed(seq, 0, (1, 2), 1)))

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert running.wait(30)  # the engine holds the first work
    second = threading.Thread(target=call, args=(1,))
    second.start()
    until(lambda: core.scheduler.waiting() == 1, "the second work queued")  # the queue is full
    with pytest.raises(LimitExceededError, match="queue is full") as err:
        core.run(Feed(2, 0, (1, 2), 1))
    assert err.value.retry_after > 0
    gate.set()
    for t in (first, second):
        t.join(30)
    assert len(results) == 2  # the refused call took nothing from the others
    core.close()


# -- the wisp policy in the verifier -------------------------------------------------------



def test_under_the_wisp_policy_concurrent_sessions_get_the_targets_own_tokens():
    from edgekit.verifier import Coefficients

    # Each batch takes 2 ms plus 0.2 ms per row: the sessions' rounds queue and batch. The first batch
    # is held until two more works wait, so that some batch holds several however the threads run.
    v = _verifier(policy="wisp", max_sessions=6, cost=Coefficients(a=0.2, c=2.0))
    engine, core = v.service.engine, v.service.core
    real, held = engine.run_batch, []

    def hold_the_first(feeds):
        if not held:
            held.append(len(feeds))
            until(lambda: len(feeds) >= 2 or core.scheduler.waiting() >= 2, "two more works queued")
        return real(feeds)

    engine.run_batch = hold_the_first
    prompts = [DRAFT.tokenize(f"prompt number {i} for the toy") for i in range(6)]
    classes = ["realtime", "interactive", "standard", "relaxed", None, None]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        with toy_client(TARGET, noise=2.0, verifier=v, max_tokens=20, slo_class=classes[i], drafting="fixed",
                        draft_k=3, stop_at_eos=False) as client:
            results[i] = client.generate(prompts[i]).until_done()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(6))
    for i, final in results.items():
        assert list(final.token_ids) == TARGET.greedy(prompts[i], 20)
        has_slo = classes[i] is not None
        assert all((r.server.budget_ms is not None) == has_slo for r in final.stats.rounds_detail)
    assert v.service.policy == "wisp" and max(v.service.core.batch_sizes) >= 2  # rounds were batched


def test_an_sh_round_reports_its_deadline_in_the_verdict_too():
    v = _verifier()
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, slo=SpeedObjective("relaxed"),
                            draft=DRAFT.fingerprint(), draft_hidden_size=8))
    block = [3, 4, 5, 6]
    r = v.verify(BlockRequest(opened.session_id, opened.committed_length, block, upload="sh",
                              hidden=np.ones((4, 8), dtype=np.float32), draft_ms=10.0, network_ms=10.0))
    assert len(r.exchanges) == 2 and r.hidden_requested  # the toy target rejects some: two exchanges
    assert r.server.budget_ms == pytest.approx((0.5 * 4 + 1) / 2.0 * 1e3 - 20.0) and r.server.deadline_met is True


def test_a_response_budget_is_what_keeps_the_whole_response_at_its_speed():
    from edgekit.verifier import SpeedClasses

    per_round, per_response = SpeedClasses(), SpeedClasses(budget="response")
    args = dict(speed=4.0, acceptance=0.5, n_draft=4, draft_ms=100.0, network_ms=50.0, arrived=10.0)
    # Eq. 6: 3 expected tokens at 4 tok/s, less drafting and the link.
    assert per_round.objective(**args, progress=(6, 8.0)).budget_ms == pytest.approx(750 - 150)
    # 6 tokens done in the 2 s since the response began: 9 are due by 2.25 s, 25 ms of it the way down.
    ahead = per_response.objective(**args, progress=(6, 8.0))
    assert ahead.budget_ms == pytest.approx(250 - 25) and ahead.deadline == pytest.approx(10.0 + 0.225)
    # Well ahead of its speed, a response has the credit it earned; behind it, none.
    assert per_response.objective(**args, progress=(20, 8.0)).budget_ms == pytest.approx(3750 - 25)
    assert per_response.objective(**args, progress=(0, 8.0)).budget_ms < 0
    # On pace (the time since it began is this round's drafting and uplink) it is eq. 6 again.
    on_pace = per_response.objective(**args, progress=(0, 10.0 - 0.125))
    assert on_pace.budget_ms == pytest.approx(per_round.objective(**args).budget_ms)
    with pytest.raises(ValueError, match="budget must be"):
        SpeedClasses(budget="turn")


def test_a_slow_or_vanished_client_never_stalls_the_engine():
    from edgekit import ClientConfig
    from edgekit.transport import GrpcTransport
    from edgekit.verifier import Coefficients, VerifyTimeEstimator

    cost = VerifyTimeEstimator(Coefficients(a=0.1, c=2.0)).predict  # each batch 2 ms and a bit
    with toy_server(TARGET, max_sessions=4, max_context=1024, max_block=8, calibrate="off", cost=cost) as server:
        slow = GrpcTransport(server.address, ClientConfig(timeout=30))
        slow.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
        stream = slow.generate(GenerateRequest(PROMPT, "greedy", seed=0, max_tokens=900))
        next(stream)  # one token read, then the client stops reading
        gone = GrpcTransport(server.address, ClientConfig(timeout=30))
        gone.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
        gone.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
        gone.close()  # a client that opened a session and vanished
        with GrpcTransport(server.address, ClientConfig(timeout=10)) as t:
            t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
            opened = t.open_session(
                OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint())
            )
            base = opened.committed_length
            for _ in range(10):  # rounds go through while the others hold their sessions
                v = t.verify(BlockRequest(opened.session_id, base, [3, 4]))
                base = v.committed_length
            assert base >= opened.committed_length + 10  # every round committed at least its own token
        stream.close()  # the slow client gives up: its stream is cancelled, its session closed
        slow.close()
        table = server.service.sessions
        # the stream's session goes; the vanished client's waits for idle eviction
        until(lambda: not any(sid.startswith("g-") for sid in table._sessions), "the stream's session closed")
        assert len(table) == 2 and not any(sid.startswith("g-") for sid in table._sessions)
