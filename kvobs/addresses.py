"""What a port and a `HOST:PORT` are, for every flag that takes one: checked as the flag is parsed, so a bad one is
a line naming it and its range, never a traceback from the socket that would have listened on it.

    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--otlp-http", type=host_port)        # the string, checked
    host, number = split_host_port("0.0.0.0:4318")
"""

from __future__ import annotations

import argparse

MAX_PORT = 65535  # TCP's: a port is 16 bits; 0 asks the system for a free one


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` (`[::1]:4318`, `:4318` = all interfaces) -> (host, port).

    Raises:
        ValueError: no port, or a port outside 0-65535.
    """
    host, _, text = address.rpartition(":")
    if not text.isdigit():
        raise ValueError(f"expected HOST:PORT; got {address!r}")
    return host.strip("[]") or "0.0.0.0", _in_range(int(text), address)


def _in_range(number: int, said: str) -> int:
    if not 0 <= number <= MAX_PORT:
        raise ValueError(f"a port is 0-{MAX_PORT}; got {said}")
    return number


def port(text: str) -> int:
    """An argparse type: a port number (0-65535)."""
    try:
        return _in_range(int(text), text)
    except ValueError as exc:
        message = str(exc) if str(exc).startswith("a port") else f"not a port: {text!r} (0-{MAX_PORT})"
        raise argparse.ArgumentTypeError(message) from None


def host_port(text: str) -> str:
    """An argparse type: `HOST:PORT` with a port in range, kept as given."""
    try:
        split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
