"""Zeroconf: agents advertise `_pipeserve._tcp.local.`; the control plane browses for them.

Discovery is a hint, never trust: a discovered node still has to be paired with its token.
TXT fields: name, fingerprint, port, version, accelerator, models (comma-separated ids).

Forgetting nodes that leave: a graceful stop sends a goodbye (removed at once). A node that
dies without one is noticed by the browser itself, because python-zeroconf enforces a
minimum PTR TTL of 1125 s (it would otherwise stay listed for ~19 minutes): the browser
re-resolves every known node each `refresh_s`; the agent publishes its SRV/TXT/A records
with a short TTL (`ttl`, default 30 s), so a dead node's records expire from the cache, the
re-resolution gets no answer, and the node is forgotten.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceInfo, ServiceListener, Zeroconf

from orchestrator.logs import EventLogger

SERVICE_TYPE = "_pipeserve._tcp.local."
MAX_MODELS_TXT = 200  # bytes of the models field (a TXT string holds at most 255)


def _interfaces(host: str) -> tuple[Any, list[str]]:
    """(zeroconf interfaces argument, addresses to publish) for an agent bound to `host`."""
    if host in ("", "0.0.0.0"):
        addresses = [a for a in _local_ipv4() if not a.startswith("127.")] or ["127.0.0.1"]
        return InterfaceChoice.All, addresses
    return [host], [host]


def _local_ipv4() -> list[str]:
    import ifaddr  # a dependency of zeroconf: the same enumeration it uses for InterfaceChoice.All

    return sorted({ip.ip for adapter in ifaddr.get_adapters() for ip in adapter.ips if isinstance(ip.ip, str)})


def instance_name(name: str, fingerprint: str) -> str:
    """The DNS-SD instance label: the node name plus a fingerprint prefix (two nodes may share a name)."""
    return f"{name}-{fingerprint[:8]}"


class Advertiser:
    """Publishes this agent; `update_models` refreshes the TXT models field."""

    def __init__(self, name: str, fingerprint: str, host: str, port: int, version: str, accelerator: str,
                 log: EventLogger, ttl: int = 30) -> None:
        self.name, self.fingerprint, self.host, self.port = name, fingerprint, host, port
        self.version, self.accelerator, self.ttl, self.log = version, accelerator, ttl, log
        self._zc: Zeroconf | None = None
        self._info: ServiceInfo | None = None
        self._lock = threading.Lock()

    def _service_info(self, models: list[str]) -> ServiceInfo:
        joined, truncated = "", False
        for m in models:
            candidate = f"{joined},{m}" if joined else m
            if len(candidate.encode()) > MAX_MODELS_TXT:
                truncated = True
                break
            joined = candidate
        props = {"name": self.name, "fingerprint": self.fingerprint, "port": str(self.port),
                 "version": self.version, "accelerator": self.accelerator, "models": joined}
        if truncated:
            props["models_truncated"] = "1"
        _, addresses = _interfaces(self.host)
        label = instance_name(self.name, self.fingerprint)
        return ServiceInfo(SERVICE_TYPE, f"{label}.{SERVICE_TYPE}", port=self.port, properties=props,
                           addresses=[socket.inet_aton(a) for a in addresses], server=f"{label}.local.",
                           host_ttl=self.ttl, other_ttl=self.ttl)

    def start(self, models: list[str]) -> None:
        """Register the service (blocks ~1-2 s while zeroconf probes for name conflicts)."""
        interfaces, _ = _interfaces(self.host)
        with self._lock:
            self._zc = Zeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
            self._info = self._service_info(models)
            self._zc.register_service(self._info)
        self.log.info("discovery.advertised", service=self._info.name, models=len(models))

    def update_models(self, models: list[str]) -> None:
        """Publish a new model list (no-op when unchanged or not started)."""
        with self._lock:
            if self._zc is None or self._info is None:
                return
            info = self._service_info(models)
            if info.properties == self._info.properties:
                return
            self._zc.update_service(info)
            self._info = info

    def close(self) -> None:
        """Send the goodbye and stop zeroconf."""
        with self._lock:
            zc, info, self._zc, self._info = self._zc, self._info, None, None
        if zc is not None:
            if info is not None:
                zc.unregister_service(info)
            zc.close()


class DiscoveredNode(BaseModel):
    """A node seen on the LAN (a hint: pairing still needs its token)."""

    service: str
    name: str
    fingerprint: str
    address: str
    port: int
    version: str
    accelerator: str
    models: list[str]
    models_truncated: bool = False

    @property
    def url(self) -> str:
        """The agent's HTTP root."""
        return f"http://{self.address}:{self.port}"


def parse_info(info: ServiceInfo) -> DiscoveredNode | None:
    """A DiscoveredNode from resolved service info, or None when fields are missing."""
    props = {(k.decode() if isinstance(k, bytes) else k): (v.decode(errors="replace") if isinstance(v, bytes) else "")
             for k, v in (info.properties or {}).items()}
    addresses = info.parsed_addresses(IPVersion.V4Only)
    if not addresses or not info.port or not props.get("fingerprint"):
        return None
    return DiscoveredNode(service=info.name, name=props.get("name", ""), fingerprint=props["fingerprint"],
                          address=addresses[0], port=info.port, version=props.get("version", ""),
                          accelerator=props.get("accelerator", ""),
                          models=[m for m in props.get("models", "").split(",") if m],
                          models_truncated=props.get("models_truncated") == "1")


class NodeBrowser(ServiceListener):
    """Keeps the set of pipeserve agents on the LAN; `on_change(event, node)` gets added/updated/removed."""

    def __init__(self, interfaces: list[str] | None = None, refresh_s: float = 5.0, resolve_timeout_s: float = 2.0,
                 on_change: Callable[[str, DiscoveredNode], None] | None = None) -> None:
        self.interfaces = interfaces
        self.refresh_s = refresh_s
        self.resolve_timeout_ms = int(resolve_timeout_s * 1000)
        self.on_change = on_change
        self._nodes: dict[str, DiscoveredNode] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._zc: Zeroconf | None = None
        self._browser: ServiceBrowser | None = None
        self._refresher: threading.Thread | None = None

    def start(self) -> "NodeBrowser":
        """Start browsing (threads start here, never at import)."""
        self._zc = Zeroconf(interfaces=self.interfaces or InterfaceChoice.All, ip_version=IPVersion.V4Only)
        self._browser = ServiceBrowser(self._zc, SERVICE_TYPE, self)
        self._refresher = threading.Thread(target=self._refresh_loop, daemon=True, name="discovery-refresh")
        self._refresher.start()
        return self

    def nodes(self) -> list[DiscoveredNode]:
        """The nodes currently known, by name."""
        with self._lock:
            return sorted(self._nodes.values(), key=lambda n: (n.name, n.fingerprint))

    def close(self) -> None:
        """Stop browsing."""
        self._stop.set()
        if self._browser is not None:
            self._browser.cancel()
        if self._zc is not None:
            self._zc.close()
        if self._refresher is not None:
            self._refresher.join(5)

    def __enter__(self) -> "NodeBrowser":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ServiceListener callbacks run on the browser's own thread, where blocking resolution is allowed.
    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._resolve(zc, type_, name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._resolve(zc, type_, name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._forget(name)

    def _resolve(self, zc: Zeroconf, type_: str, name: str) -> bool:
        info = ServiceInfo(type_, name)
        node = parse_info(info) if info.request(zc, self.resolve_timeout_ms) else None
        if node is None:
            return False
        with self._lock:
            before = self._nodes.get(name)
            self._nodes[name] = node
        if before != node and self.on_change:
            self.on_change("added" if before is None else "updated", node)
        return True

    def _forget(self, name: str) -> None:
        with self._lock:
            node = self._nodes.pop(name, None)
        if node is not None and self.on_change:
            self.on_change("removed", node)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            with self._lock:
                names = list(self._nodes)
            for name in names:
                if self._stop.is_set() or self._zc is None:
                    return
                try:
                    alive = self._resolve(self._zc, SERVICE_TYPE, name)
                except Exception:  # noqa: BLE001 (zeroconf closing under us: stop quietly)
                    return
                if not alive:
                    self._forget(name)
