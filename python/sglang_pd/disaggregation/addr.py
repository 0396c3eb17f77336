"""Validation of a request's bootstrap address (``bootstrap_host``, ``bootstrap_port``).

Pure and light (stdlib only, no zmq or torch), so the HTTP frontend can answer 400 for a bad
address before the request reaches the engine, and ``BootstrapClient`` runs the same check before
it hands an endpoint to ZMQ. Accepted hosts: a DNS hostname (letters, digits, ``-`` and ``_`` in
dot-separated labels of at most 63 characters, 253 in all, optional trailing dot), an IPv4 address,
or an IPv6 address, bare or in brackets (a ``%zone`` suffix is allowed). Ports: 1..65535.
Anything else (spaces, ``/``, ``;``, ``*``, ``:`` outside IPv6) could make ZMQ raise or read
another endpoint syntax, so it is refused here.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
MAX_HOST_LEN = 253


def _ipv6(host: str) -> ipaddress.IPv6Address | None:
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" not in inner:
        return None
    try:
        return ipaddress.IPv6Address(inner)
    except ValueError:
        return None


def host_error(host: Any) -> str | None:
    """Why ``host`` is not a usable bootstrap host, or None."""
    if not isinstance(host, str) or not host:
        return f"bootstrap_host must be a non-empty string, got {host!r}"
    shown = host if len(host) <= 80 else host[:77] + "..."
    if len(host) > MAX_HOST_LEN + 2:  # + 2 for IPv6 brackets
        return f"bootstrap_host is {len(host)} characters long; at most {MAX_HOST_LEN} are allowed"
    if host.startswith("[") or ":" in host:
        if _ipv6(host) is None:
            return (f"bootstrap_host {shown!r} is not a valid IPv6 address "
                    "(use e.g. ::1 or [::1]; ':' is allowed only in IPv6 addresses)")
        return None
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host.rstrip("."))
        except ValueError:
            return f"bootstrap_host {shown!r} is not a valid IPv4 address"
        return None
    if len(host) > MAX_HOST_LEN or not all(_LABEL.fullmatch(label) for label in labels):
        return (f"bootstrap_host {shown!r} is not a valid hostname or IP address: use letters, "
                "digits, '-' and '_' in dot-separated labels of 1-63 characters "
                "(no spaces, '/', ';' or '*'), an IPv4 address, or an IPv6 address")
    return None


def port_error(port: Any) -> str | None:
    """Why ``port`` is not a usable bootstrap port, or None."""
    if isinstance(port, bool) or not isinstance(port, int):
        return f"bootstrap_port must be an integer, got {port!r}"
    if not 1 <= port <= 65535:
        return f"bootstrap_port must be in 1..65535, got {port}"
    return None


def validate_bootstrap_addr(host: Any, port: Any) -> str | None:
    """None if (host, port) can be a prefill's bootstrap address, else a message for a 400."""
    return host_error(host) or port_error(port)


def is_ipv6(host: str) -> bool:
    return _ipv6(host) is not None


def tcp_endpoint(host: str, port: int) -> str:
    """The ZMQ endpoint for a validated address (IPv6 in brackets). ValueError if invalid."""
    err = validate_bootstrap_addr(host, port)
    if err is not None:
        raise ValueError(err)
    v6 = _ipv6(host)
    return f"tcp://[{v6}]:{port}" if v6 is not None else f"tcp://{host}:{port}"
