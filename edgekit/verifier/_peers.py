"""Which host a call comes from, for the per-client limits of a verifier without tokens.

Behind a proxy every call's peer is the proxy, so every device would count as one client and
`max_sessions_per_client` would become a limit on all of them together. A proxy named in
`trusted_proxies` (addresses or networks) is taken at its word: the call's host is the last
address of its `x-forwarded-for` (the one the proxy appended; any a client wrote itself stand
before it). From any other peer the header is ignored: a client cannot choose whom it counts as.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ..errors import ConfigError

__all__ = ["Peers"]

_FORWARDED = "x-forwarded-for"


class Peers:
    """`trusted`: comma-separated addresses or networks of the proxies in front ("" for none)."""

    def __init__(self, trusted: str = "") -> None:
        try:
            self._trusted = [ipaddress.ip_network(p.strip(), strict=False) for p in trusted.split(",") if p.strip()]
        except ValueError as exc:
            raise ConfigError(f"trusted_proxies: {exc} (write addresses or networks, comma-separated)") from None

    def host(self, peer: str, metadata: Iterable[tuple[str, str | bytes]] = ()) -> str:
        """The host a call counts as, from gRPC's peer string ('ipv4:1.2.3.4:5', 'ipv6:[::1]:5')."""
        host = _peer_host(peer)
        if not self._trusted or not self._is_trusted(host):
            return host
        forwarded = [v for k, v in metadata if k == _FORWARDED]
        if not forwarded:
            return host
        last = forwarded[-1]
        last = last.decode("latin-1") if isinstance(last, bytes) else last
        candidate = last.rsplit(",", 1)[-1].strip()
        try:
            return str(ipaddress.ip_address(candidate))
        except ValueError:
            return host  # not an address: the proxy's own

    def _is_trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        return any(address in network for network in self._trusted)


def _peer_host(peer: str) -> str:
    """The host of a gRPC peer string ('ipv4:1.2.3.4:5', 'ipv6:[::1]:5', 'unix:...')."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rsplit(":", 1)[0]
        return host[1:-1] if host.startswith("[") else host
    return peer
