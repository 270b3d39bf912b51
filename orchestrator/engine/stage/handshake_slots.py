"""Who may be in the middle of a stage's handshake: known peers first, strangers bounded.

A stage's transport port takes connections from its cluster's peers (the coordinator and
the previous stage) and from anyone else on the LAN. Before, one pool of 32 unauthenticated
slots served them all: 96 threads reconnecting in a loop held it, and a `kill -9` recovery
took 90 s instead of 3 s because the coordinator's connection was refused each time. Now:

* **known hosts** — the hosts of the cluster's nodes (from its TOML) and of every peer that
  has proved the secret since — have `known` slots of their own, which strangers never use;
* **strangers** share `strangers` slots, at most `per_source` per source address, so one
  host cannot take them all either.

A connection that finds no slot is closed at once (the caller logs it, throttled).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import Counter
from collections.abc import Iterable

KNOWN_SLOTS = 16  # handshakes at once from the cluster's own hosts
STRANGER_SLOTS = 32  # handshakes at once from any other address
PER_SOURCE = 4  # handshakes at once from one other address


def host_key(host: str) -> str:
    """A comparable form of an IP address ('::ffff:10.0.0.1' is '10.0.0.1'); names stay as they are."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.lower()
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def resolve_hosts(hosts: Iterable[str]) -> set[str]:
    """The hosts as addresses: IPs as they are, names resolved (best effort, at start)."""
    out: set[str] = set()
    for host in hosts:
        out.add(host_key(host))
        try:
            out.update(host_key(str(info[4][0])) for info in socket.getaddrinfo(host, None))
        except (OSError, UnicodeError):
            pass
    return out


class HandshakeSlots:
    """Counting slots for handshakes in progress (thread-safe)."""

    def __init__(self, known_hosts: Iterable[str], known: int = KNOWN_SLOTS, strangers: int = STRANGER_SLOTS,
                 per_source: int = PER_SOURCE) -> None:
        self._known_hosts = set(resolve_hosts(known_hosts))
        self.known, self.strangers, self.per_source = known, strangers, per_source
        self._lock = threading.Lock()
        self._known_in = 0
        self._by_source: Counter[str] = Counter()

    def is_known(self, host: str) -> bool:
        """Whether `host` is one of the cluster's (or has proved the secret)."""
        return host_key(host) in self._known_hosts

    def learn(self, host: str) -> None:
        """A peer at `host` proved the secret: its later connections use the known slots."""
        with self._lock:
            self._known_hosts.add(host_key(host))

    def acquire(self, host: str) -> tuple[str | None, bool]:
        """Take a slot for a handshake from `host`: (None, known) when taken — give it back with
        `release(host, known)` — else (why not, known)."""
        key = host_key(host)
        with self._lock:
            if key in self._known_hosts:
                if self._known_in >= self.known:
                    return f"{self.known} handshakes already in progress from the cluster's hosts", True
                self._known_in += 1
                return None, True
            if sum(self._by_source.values()) >= self.strangers:
                return f"{self.strangers} handshakes already in progress from other hosts", False
            if self._by_source[key] >= self.per_source:
                return f"{self.per_source} handshakes already in progress from {key}", False
            self._by_source[key] += 1
            return None, False

    def release(self, host: str, known: bool) -> None:
        """Give back the slot `acquire` took (`known`: whether it was a known host's)."""
        key = host_key(host)
        with self._lock:
            if known:
                self._known_in = max(0, self._known_in - 1)
            elif self._by_source[key] > 1:
                self._by_source[key] -= 1
            else:
                self._by_source.pop(key, None)


__all__ = ["KNOWN_SLOTS", "PER_SOURCE", "STRANGER_SLOTS", "HandshakeSlots", "host_key", "resolve_hosts"]
