"""Link estimation: RFC 6298 smoothing, rates from payload pings, loss from
retransmission delays, passive updates from rounds, and dead verifiers."""

from __future__ import annotations

import pytest

from edgekit.link import probe


@pytest.mark.models
def test_probe_of_the_real_verifier_on_loopback(gemma_server):
    from edgekit import ClientConfig
    from edgekit.transport import GrpcTransport

    with GrpcTransport(gemma_server.address, ClientConfig(timeout=10.0)) as t:
        r = probe(t, pings=5, tries=2, payload_bytes=1 << 20)
    assert 0 < r.link.rtt_ms < 50
    assert r.link.uplink_mbps > 50 and r.link.downlink_mbps > 50  # loopback moves 1 MB fast
