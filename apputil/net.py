"""Addresses of this machine, as the servers and the training processes see them."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether `host` ("localhost" or an address, IPv6 in brackets or not) is the loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
