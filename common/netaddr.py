"""Who a client is, for bounds kept per client (failed page logins in the bridge, password
checks in the exporter): one rule, so both count a host the same way."""

from __future__ import annotations

import ipaddress

IPV6_CLIENT_PREFIX = 64  # one host is commonly given a whole /64


def client_key(remote: str | None) -> str:
    """Who a failed guess is counted against: the IPv4 address, or the IPv6 /64 (an IPv4-mapped
    IPv6 address counts as its IPv4 address); anything else (a Unix socket) as given."""
    try:
        address = ipaddress.ip_address((remote or "").split("%")[0])
    except ValueError:
        return remote or ""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)
