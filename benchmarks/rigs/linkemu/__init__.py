"""Link emulation on one machine, for tests and benchmarks (WISV's links, here).

The verifier runs in a network namespace behind a veth pair whose two ends are
rate-limited by the kernel (`tc tbf`, one rate each way). Delay, jitter and loss
are added by a user-space TCP proxy on the client's side of the pair, since this
kernel has no netem:

    client --loopback--> DelayProxy --veth (tbf up)--> [netns] verifier
           <-----------            <--veth (tbf down)--

Loss is modelled as TCP shows it to an application: a lost segment delays its
bytes (and, in order, everything behind them) by a retransmission timeout.
Needs root and iproute2 (`ip`, `tc`); `available()` says whether they are here.
It lives beside the benchmarks (`benchmarks.rigs.linkemu`), not in edgekit's wheel: what a test or
a benchmark of links needs, never what a device or a verifier runs.
"""

from ._bed import LinkProfile, Testbed, available
from ._proxy import DelayProxy

__all__ = ["DelayProxy", "LinkProfile", "Testbed", "available"]
