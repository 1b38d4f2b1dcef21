"""Link estimation: RFC 6298 smoothing, rates from payload pings, loss from
retransmission delays, passive updates from rounds, and dead verifiers."""

from __future__ import annotations

import pytest

from edgekit import VerifierUnavailableError
from edgekit.link import MIN_RTO_MS, LinkEstimator, probe
from edgekit.testing import (
    Call,
    FakeDraftModel,
    ScriptedTransport,
    SimulatedLink,
    ToyLanguageModel,
    toy_client,
    toy_verifier,
)


def test_srtt_and_rttvar_follow_rfc_6298():
    est = LinkEstimator()
    est.add_rtt(100.0)
    assert (est.srtt_ms, est.rttvar_ms) == (100.0, 50.0)
    est.add_rtt(60.0)
    assert est.rttvar_ms == pytest.approx(0.75 * 50 + 0.25 * 40)
    assert est.srtt_ms == pytest.approx(0.875 * 100 + 0.125 * 60)
    assert est.state().samples == 2


def test_a_retransmission_delay_counts_as_loss_not_as_delay():
    est = LinkEstimator()
    for _ in range(10):
        est.add_rtt(20.0)
    est.add_rtt(20.0 + MIN_RTO_MS + 5)
    assert est.srtt_ms == pytest.approx(20.0)  # kept out of the smoothed RTT
    assert est.loss_rate == pytest.approx(1 / 16)


@pytest.mark.parametrize("rtt, up, down", [(5.0, 20.0, 20.0), (50.0, 500.0, 500.0), (50.0, 20.0, 100.0)])
def test_probe_recovers_a_simulated_link(rtt, up, down):
    link = SimulatedLink(rtt_ms=rtt, uplink_mbps=up, downlink_mbps=down, jitter_ms=0.2, seed=1)
    result = probe(toy_verifier(ToyLanguageModel(), link=link), payload_bytes=256 * 1024, tries=5)
    assert result.link.rtt_ms == pytest.approx(rtt, abs=1.0)
    assert result.link.rtt_jitter_ms < 1.0
    # the best of 5 tries sees at most a little jitter on top of bits / rate
    assert result.link.uplink_mbps == pytest.approx(up, rel=0.1)
    assert result.link.downlink_mbps == pytest.approx(down, rel=0.1)
    assert result.pings == 5 + 2 * 2 * 5


def test_probe_estimates_loss_on_a_lossy_link():
    link = SimulatedLink(rtt_ms=10.0, loss=0.1, seed=3)
    est = LinkEstimator(loss_alpha=0.01)
    for _ in range(10):
        probe(toy_verifier(ToyLanguageModel(), link=link), est, pings=50, tries=1)
    assert 0.05 < est.loss_rate < 0.15
    assert est.srtt_ms == pytest.approx(10.0, abs=0.5)


def test_rounds_update_the_link_and_carry_it():
    client = toy_client(ToyLanguageModel(seed=3), max_tokens=20, stop_at_eos=False, drafting="fixed")
    client.generate("link").until_done()
    verifier = client.transport
    assert client.link.samples == len(verifier.verify_calls)
    # each round carries the estimate as it stood before that round
    assert [b.link.samples for b in verifier.verify_calls] == list(range(len(verifier.verify_calls)))


def test_probing_a_dead_verifier_fails_within_its_deadline():
    from edgekit import ClientConfig
    from edgekit.transport import GrpcTransport

    t = ScriptedTransport(GrpcTransport("127.0.0.1:9", ClientConfig(timeout=1.0, connect_timeout=1.0)))
    with pytest.raises(VerifierUnavailableError, match="127.0.0.1:9"):
        probe(t)
    assert t.count("ping") == 1  # the first ping's failure ends the probe: one deadline spent, not one per ping
    t.close()


def test_the_async_client_probes_the_same_way():
    import asyncio

    from edgekit import AsyncEdgeClient

    async def main():
        link = SimulatedLink(rtt_ms=12.0, uplink_mbps=50.0, downlink_mbps=50.0, seed=2)
        client = AsyncEdgeClient(toy_verifier(ToyLanguageModel(), link=link),
                                 draft=FakeDraftModel(ToyLanguageModel()))
        try:
            return await client.probe_link(pings=5, tries=2, payload_bytes=128 * 1024)
        finally:
            await client.close()

    result = asyncio.run(main())
    assert result.link.rtt_ms == pytest.approx(12.0, abs=0.5)
    assert result.link.uplink_mbps == pytest.approx(50.0, rel=0.1)


def test_a_queued_empty_ping_does_not_skew_the_rate():
    """The empty ping paired with each payload queues (12 ms against 1 ms): the payload's time is
    read against the probe's quickest empty exchange, not against that one, so the rate is the
    link's (1,000 Mbps), where pairs read 1,491 (and on loopback under load, no rate at all)."""
    empties = iter([1.0] * 5)

    def jittery(call: Call) -> float:
        size = call.arguments.get("payload_bytes") or call.arguments.get("reply_bytes") or 0
        return 1.0 + size * 8 / 1e6 if size else next(empties, 12.0)  # 1,000 Mbps each way

    r = probe(ScriptedTransport(handler=jittery, address="fake"), pings=5, tries=2, payload_bytes=1 << 20)
    assert r.link.uplink_mbps == pytest.approx(1000.0, rel=1e-6)
    assert r.link.downlink_mbps == pytest.approx(1000.0, rel=1e-6)


def test_a_payload_that_cannot_cross_in_time_says_so():
    def slow_uplink(call: Call) -> float:  # empty pings cross, a payload up does not
        if call.arguments["payload_bytes"]:
            raise VerifierUnavailableError("verifier at fake did not answer a ping within 2 s", address="fake")
        return 8.0

    with pytest.raises(VerifierUnavailableError, match="empty pings took 8 ms but a 64 KiB payload up did not cross"):
        probe(ScriptedTransport(handler=slow_uplink, address="fake"), payload_bytes=64 * 1024)
