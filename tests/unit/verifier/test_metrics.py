"""The verifier's serving statistics and its Prometheus endpoint: the counters equal
what the rounds did (drafted, accepted, per position, per SLO class, missed
deadlines, committed tokens and goodput), scraped over HTTP from a real
`VerifierServer` over the toy engine; an SH round counts once, with its first
half's deadline; without prometheus-client the endpoint is refused with the install
hint; two servers in one process export their own figures."""

from __future__ import annotations

import logging
import sys
import urllib.error
import urllib.request

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgekit import ClientConfig, ConfigError, DependencyMissingError, ServerConfig
from edgekit.protocol import BlockRequest, GenerateRequest, OpenRequest, SpeedObjective
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server, toy_verifier
from edgekit.transport import GrpcTransport
from edgekit.verifier import Coefficients, ServingStats, ToyEngine, VerifierServer

TARGET = ToyLanguageModel(seed=9)
DRAFT = FakeDraftModel(ToyLanguageModel(seed=9, noise=2.0), n_embd=8)
PROMPT = DRAFT.tokenize("count what the verifier served")



def _wrong(context: list[int]) -> int:
    """A token the toy target does not pick next."""
    return (TARGET.greedy(context, 1)[0] + 1) % TARGET.vocab_size


PLAN = [  # each round: the block drafted on a context, and the device's drafting time
    (lambda c: TARGET.greedy(c, 3) + [_wrong(c + TARGET.greedy(c, 3))], 0.0),  # three right, then one wrong
    (lambda c: TARGET.greedy(c, 2), 0.0),  # all right: the verifier adds its bonus token
    (lambda c: [], 0.0),  # no draft: one target step
    (lambda c: [_wrong(c)], 0.0),  # wrong at once
    (lambda c: TARGET.greedy(c, 1) + [_wrong(c + TARGET.greedy(c, 1))], 5000.0),  # drafted past its budget: a miss
]


def _server(**config) -> VerifierServer:
    return toy_server(TARGET, metrics_port=0, max_sessions=4, max_context=256, max_block=8, calibrate="off",
                      **config).start()


def _scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint, by (name, labels)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _get(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# -- the counters, as scraped -------------------------------------------------------------


def test_the_endpoint_exports_what_the_rounds_did():
    server = _server()
    try:
        assert server.metrics_address is not None and server.metrics_address != server.address
        rounds = {"realtime": [], "best-effort": []}  # (block, result)
        with GrpcTransport(server.address, ClientConfig(timeout=10)) as t:
            t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
            for cls, slo in (("realtime", SpeedObjective("realtime")), ("best-effort", SpeedObjective())):
                opened = t.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, slo=slo,
                                        draft=DRAFT.fingerprint()))
                context, base = list(PROMPT), opened.committed_length
                for make, draft_ms in PLAN:
                    block = make(context)
                    r = t.verify(BlockRequest(opened.session_id, base, block, draft_ms=draft_ms))
                    committed = block[: r.accepted] + ([r.next_token] if r.next_token is not None else [])
                    assert committed == TARGET.greedy(context, len(committed))
                    rounds[cls].append((block, r))
                    context += committed
                    base = r.committed_length
            relaxed = GenerateRequest(PROMPT, "greedy", seed=0, max_tokens=3, slo=SpeedObjective("relaxed"))
            generated = list(t.generate(relaxed))
        everything = rounds["realtime"] + rounds["best-effort"]
        accepted = [r.accepted for _, r in everything]
        assert accepted == [3, 2, 0, 0, 1] * 2
        committed_by_rounds = {cls: sum(len(b[: r.accepted]) + 1 for b, r in rs) for cls, rs in rounds.items()}

        m = _scrape(server.metrics_address)
        drafted = [b for b, _ in everything if b]
        assert _get(m, "edgekit:spec_decode_num_drafts_total") == len(drafted) == 8
        assert _get(m, "edgekit:spec_decode_num_draft_tokens_total") == sum(map(len, drafted)) == 18
        assert _get(m, "edgekit:spec_decode_num_accepted_tokens_total") == sum(accepted) == 12
        longest = max(map(len, drafted))
        for pos in range(longest):
            assert _get(m, "edgekit:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == sum(
                a > pos for a in accepted
            )
        assert [_get(m, "edgekit:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
                for p in range(4)] == [6, 4, 2, 0]
        assert ("edgekit:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(longest)),)) not in m

        # Per class: every round counted once; misses as the verdicts reported them; best effort has no deadline.
        realtime = [r for _, r in rounds["realtime"]]
        missed = sum(r.server.deadline_met is False for r in realtime)
        assert realtime[-1].server.deadline_met is False and missed >= 1
        assert _get(m, "edgekit:slo_rounds_total", slo_class="realtime") == 5
        assert _get(m, "edgekit:slo_deadline_rounds_total", slo_class="realtime") == 5
        assert _get(m, "edgekit:slo_violations_total", slo_class="realtime") == missed
        assert _get(m, "edgekit:slo_violation_ratio", slo_class="realtime") == pytest.approx(missed / 5)
        assert _get(m, "edgekit:slo_rounds_total", slo_class="best-effort") == 5
        assert _get(m, "edgekit:slo_deadline_rounds_total", slo_class="best-effort") == 0
        assert _get(m, "edgekit:slo_violations_total", slo_class="best-effort") == 0
        assert _get(m, "edgekit:slo_violation_ratio", slo_class="best-effort") == 0
        # The classes the verifier names are there before their first round; Generate's tokens count.
        assert _get(m, "edgekit:slo_rounds_total", slo_class="interactive") == 0
        assert _get(m, "edgekit:slo_rounds_total", slo_class="relaxed") == 0
        assert _get(m, "edgekit:slo_committed_tokens_total", slo_class="relaxed") == len(generated) == 3
        for cls in ("realtime", "best-effort"):
            assert _get(m, "edgekit:slo_committed_tokens_total", slo_class=cls) == committed_by_rounds[cls]
            for hist in ("edgekit:queue_time_seconds", "edgekit:verify_time_seconds"):
                assert _get(m, f"{hist}_count", slo_class=cls) == 5
                assert _get(m, f"{hist}_bucket", slo_class=cls, le="+Inf") == 5
        assert _get(m, "edgekit:verify_time_seconds_sum", slo_class="realtime") > 0

        total = sum(committed_by_rounds.values()) + 3
        assert _get(m, "edgekit:committed_tokens_total") == total
        assert _get(m, "edgekit:generated_tokens_total") == 3
        assert _get(m, "edgekit:goodput_tokens_per_second") > 0

        # The engine: every batch counted; two sessions are open, nothing waits.
        batches = sum(server.service.core.batch_sizes.values())
        assert batches >= 10 + 2 + 4  # the rounds, the prefills, the target-only steps
        assert _get(m, "edgekit:batch_size_count") == _get(m, "edgekit:batch_rows_count") == batches
        assert _get(m, "edgekit:batch_size_bucket", le="+Inf") == batches
        assert _get(m, "edgekit:engine_seconds_total") > 0
        assert 0 <= _get(m, "edgekit:engine_estimated_batches_total") <= batches
        assert _get(m, "edgekit:engine_estimated_seconds_total") >= 0
        assert _get(m, "edgekit:engine_estimate_error_seconds_total") >= 0
        assert _get(m, "edgekit:queue_depth") == 0
        assert _get(m, "edgekit:sessions") == 2
    finally:
        server.stop()
    assert server.metrics_address is None


def test_the_exported_names_are_the_documented_ones():
    server = _server()
    try:
        names = {name for name, _ in _scrape(server.metrics_address)}
    finally:
        server.stop()
    assert {
        "edgekit:queue_depth", "edgekit:sessions",
        "edgekit:batch_size_bucket", "edgekit:batch_size_count", "edgekit:batch_size_sum",
        "edgekit:batch_rows_bucket", "edgekit:batch_rows_count", "edgekit:batch_rows_sum",
        "edgekit:engine_seconds_total", "edgekit:engine_estimated_batches_total",
        "edgekit:engine_estimated_seconds_total", "edgekit:engine_estimate_error_seconds_total",
        "edgekit:spec_decode_num_drafts_total", "edgekit:spec_decode_num_draft_tokens_total",
        "edgekit:spec_decode_num_accepted_tokens_total",
        "edgekit:semantic_rounds_total", "edgekit:semantic_accepted_mismatches_total",
        "edgekit:committed_tokens_total", "edgekit:generated_tokens_total", "edgekit:goodput_tokens_per_second",
        "edgekit:slo_rounds_total", "edgekit:slo_deadline_rounds_total", "edgekit:slo_violations_total",
        "edgekit:slo_committed_tokens_total", "edgekit:slo_violation_ratio",
        "edgekit:queue_time_seconds_bucket", "edgekit:queue_time_seconds_count", "edgekit:queue_time_seconds_sum",
        "edgekit:verify_time_seconds_bucket", "edgekit:verify_time_seconds_count", "edgekit:verify_time_seconds_sum",
    } == names  # per-position counts appear with the first draft


def test_the_budget_figures_are_the_budgets_own():
    """With GOODSPEED budgets: C, the budget each open session was last told and the mean of their
    acceptance estimates, as scraped, are what `Budgets.states()` holds."""
    server = _server(budgets="goodspeed", token_budget=10)
    try:
        with GrpcTransport(server.address, ClientConfig(timeout=10)) as t:
            t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
            for plan in (PLAN[:2], PLAN[2:4], PLAN[:1]):  # three sessions, each its own luck
                opened = t.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
                context, base = list(PROMPT), opened.committed_length
                for make, _ in plan:
                    block = make(context)
                    r = t.verify(BlockRequest(opened.session_id, base, block))
                    context += block[: r.accepted] + ([r.next_token] if r.next_token is not None else [])
                    base = r.committed_length
            m = _scrape(server.metrics_address)
            budgets = server.service.budgets
            states = list(budgets.states().values())
    finally:
        server.stop()
    assert len(states) == 3
    told = [st.told for st in states]
    alphas = [st.alpha for st in states]
    assert len(set(alphas)) > 1 and set(alphas) != {0.5}  # the verdicts moved the estimates apart
    assert _get(m, "edgekit:budget_capacity") == budgets.last_capacity == 10
    assert _get(m, "edgekit:budget_tokens_count") == 3 and _get(m, "edgekit:budget_tokens_sum") == sum(told)
    for bound in (1, 2, 4, 8, 32):
        assert _get(m, "edgekit:budget_tokens_bucket", le=f"{float(bound)}") == sum(b <= bound for b in told)
    assert _get(m, "edgekit:budget_acceptance_estimate") == pytest.approx(sum(alphas) / 3)


# -- SH rounds, Generate and the stats object -------------------------------------------------------


def test_an_sh_round_counts_once_with_its_first_halfs_deadline():
    v = toy_verifier(TARGET, max_block=8, max_context=256, max_sessions=2)
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, slo=SpeedObjective("standard"),
                            draft=DRAFT.fingerprint(), draft_hidden_size=8))
    block = TARGET.greedy(PROMPT, 2) + [_wrong(PROMPT + TARGET.greedy(PROMPT, 2))]
    hidden = np.ones((len(block), 8), dtype=np.float32)
    r = v.verify(BlockRequest(opened.session_id, opened.committed_length, block, upload="sh", hidden=hidden,
                              draft_ms=5000.0))
    assert r.hidden_requested and r.accepted == 2  # two exchanges, one round
    s = v.service.stats.snapshot()
    c = s.classes["standard"]
    assert (c.rounds, c.with_deadline, c.missed, c.committed_tokens) == (1, 1, 1, 3)
    assert (s.drafts, s.draft_tokens, s.accepted_tokens, s.accepted_per_position) == (1, 3, 2, (1, 1, 0))
    assert c.queue_s.count == c.verify_s.count == 1 and c.verify_s.sum > 0


def test_a_retried_round_is_counted_once():
    v = toy_verifier(TARGET, max_block=8, max_context=256, max_sessions=2)
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
    block = BlockRequest(opened.session_id, opened.committed_length, TARGET.greedy(PROMPT, 2))
    assert v.verify(block) == v.verify(block)
    s = v.service.stats.snapshot()
    assert (s.drafts, s.accepted_tokens, s.classes["best-effort"].rounds, s.committed_tokens) == (1, 2, 1, 3)


def test_the_estimators_forecasts_are_set_beside_the_measured_times():
    cost = Coefficients(a=0.2, c=2.0)  # every batch takes (and is forecast) about 2 ms and more
    v = toy_verifier(TARGET, max_block=8, max_context=256, max_sessions=2, cost=cost)
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
    v.verify(BlockRequest(opened.session_id, opened.committed_length, [3, 4]))
    s = v.service.stats.snapshot()
    assert s.batches == s.estimated_batches == 2
    assert s.estimated_s >= 2 * 2e-3 and s.engine_s > 0 and s.estimate_error_s >= 0
    # A batch without a forecast (an estimator that has seen nothing yet) is left out of them.
    stats = ServingStats()
    stats.record_batch(1, 4, run_ms=5.0, estimated_ms=0.0)
    stats.record_batch(2, 8, run_ms=5.0, estimated_ms=4.0)
    s = stats.snapshot()
    assert (s.batches, s.estimated_batches, s.batch_sizes, s.batch_rows) == (2, 1, {1: 1, 2: 1}, {4: 1, 8: 1})
    assert (s.engine_s, s.estimated_s, s.estimate_error_s) == pytest.approx((0.010, 0.004, 0.001))


def test_goodput_counts_the_last_window_only():
    now = [100.0]
    stats = ServingStats(window_s=10.0, clock=lambda: now[0])
    now[0] = 102.0
    stats.record_round("x", drafted=4, accepted=3, committed=4, queue_ms=1.0, verify_ms=2.0, deadline_met=None)
    assert stats.snapshot().goodput == pytest.approx(4 / 2.0)  # since start: 2 s
    now[0] = 105.5
    stats.record_generated("x", 6)
    assert stats.snapshot().goodput == pytest.approx(10 / 5.5)
    now[0] = 113.5  # the first second's tokens left the window
    s = stats.snapshot()
    assert (s.goodput, s.window_s, s.committed_tokens, s.generated_tokens) == (pytest.approx(6 / 10.0), 10.0, 10, 6)
    assert s.classes["x"].committed_tokens == 10 and s.classes["x"].rounds == 1


def test_histograms_bucket_by_upper_bound():
    stats = ServingStats(classes=["a"])
    for ms in (0.5, 1.0, 30.0, 20_000.0):
        stats.record_round("a", drafted=0, accepted=0, committed=1, queue_ms=ms, verify_ms=ms, deadline_met=True)
    h = stats.snapshot().classes["a"].queue_s
    assert dict(zip([*h.bounds, "inf"], h.cumulative)) == {
        0.001: 2, 0.0025: 2, 0.005: 2, 0.01: 2, 0.025: 2, 0.05: 3, 0.1: 3, 0.25: 3, 0.5: 3, 1.0: 3, 2.5: 3,
        5.0: 3, 10.0: 3, "inf": 4,
    }
    assert h.sum == pytest.approx(20.0315)
    assert stats.snapshot().drafts == 0  # a round without draft tokens is no draft


def test_each_batch_is_logged_at_debug_level(caplog):
    v = toy_verifier(TARGET, max_block=8, max_context=256, max_sessions=2)
    v.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
    with caplog.at_level(logging.DEBUG, logger="edgekit.verifier"):
        opened = v.open_session(OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint()))
        v.verify(BlockRequest(opened.session_id, opened.committed_length, [3, 4]))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch:")]
    assert lines[-1].startswith("batch: 1 works, 3 rows,") and "estimated" in lines[-1] and "ran" in lines[-1]


# -- the endpoint: optional, one per server -------------------------------------------------------


def test_without_prometheus_client_the_endpoint_is_refused_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import prometheus_client` fails
    engine = ToyEngine(TARGET, n_seq=2, max_context=64)
    with pytest.raises(DependencyMissingError, match=r"prometheus-client is not installed; run: pip install "
                                                     r"'edgekit\[server\]'") as info:
        VerifierServer(engine, ServerConfig(port=0, metrics_port=0, max_sessions=2, max_context=64))
    assert isinstance(info.value, ImportError) and info.value.extra == "server"
    # Without an endpoint, nothing needs it.
    server = VerifierServer(engine, ServerConfig(port=0, max_sessions=2, max_context=64, calibrate="off")).start()
    assert server.metrics_address is None
    server.stop()


def test_two_servers_in_one_process_export_their_own_figures():
    one, two = _server(), _server()
    try:
        assert one.metrics_address != two.metrics_address
        with GrpcTransport(one.address, ClientConfig(timeout=10)) as t:
            t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=8)
            opened = t.open_session(
                OpenRequest(PROMPT, mode="greedy", seed=0, draft=DRAFT.fingerprint())
            )
            t.verify(BlockRequest(opened.session_id, opened.committed_length, TARGET.greedy(PROMPT, 2)))
        a, b = _scrape(one.metrics_address), _scrape(two.metrics_address)
        assert _get(a, "edgekit:spec_decode_num_accepted_tokens_total") == 2
        assert _get(b, "edgekit:spec_decode_num_accepted_tokens_total") == 0
        assert _get(a, "edgekit:sessions") == 1 and _get(b, "edgekit:sessions") == 0
        # Nothing went to prometheus_client's global registry.
        assert not any(m.name.startswith("edgekit") for m in prometheus_client.REGISTRY.collect())
    finally:
        one.stop()
        address = two.metrics_address
        two.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://{address}/metrics", timeout=2)


def test_a_taken_metrics_port_is_a_config_error():
    first = _server()
    try:
        port = int(first.metrics_address.rpartition(":")[2])
        engine = ToyEngine(TARGET, n_seq=2, max_context=64)
        server = VerifierServer(engine, ServerConfig(port=0, metrics_port=port, max_sessions=2, max_context=64,
                                                     calibrate="off"))
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            server.start()
        server.stop()
    finally:
        first.stop()


def test_the_metrics_port_is_checked_and_read_from_the_environment(monkeypatch):
    with pytest.raises(ConfigError, match="metrics_port must be a port number"):
        ServerConfig(metrics_port=70000)
    monkeypatch.setenv("EDGEKIT_SERVE_METRICS_PORT", "9464")
    assert ServerConfig.from_env().metrics_port == 9464
