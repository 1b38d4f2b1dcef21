"""Where a verifier's address points: its host, and whether that host is this machine."""

from __future__ import annotations

import ipaddress

__all__ = ["host_of", "is_local"]


def host_of(rest: str) -> str:
    """The host of `HOST:PORT[/path]`, `[IPv6]:PORT` or `unix:PATH` (a socket: "unix")."""
    if rest.startswith("unix:"):
        return "unix"
    authority = rest.partition("/")[0].rpartition("@")[2]
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def is_local(host: str) -> bool:
    """Whether `host` is this machine by its address or name alone (no name is resolved: a name
    that resolves to loopback here may not elsewhere, and a resolver can be made to lie)."""
    if host in ("unix", "localhost") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
