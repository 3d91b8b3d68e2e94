"""Addresses of this machine, as the servers and the training processes see them."""

from __future__ import annotations

import errno
import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether `host` ("localhost" or an address, IPv6 in brackets or not) is the loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """`host:port` as gRPC and log lines write it: an IPv6 address in brackets."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the caller binds it moments later)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket holds TCP `port` of `host`, so that a server binding it
    would fail; asked by binding it as the servers do (with SO_REUSEADDR, so a port
    left in TIME_WAIT by a server that just stopped counts as free). Any other failure
    (a host that is not this machine's) is left to the server's own bind to report."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False
