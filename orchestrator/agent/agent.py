"""The agent: its parts wired together, started and stopped in order."""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from orchestrator import __version__
from orchestrator.agent import device_probe, netif
from orchestrator.agent import report as node_report
from orchestrator.agent.compute import ComputeProfiler
from orchestrator.agent.discovery import Advertiser
from orchestrator.agent.identity import AgentState
from orchestrator.agent.inventory import Inventory
from orchestrator.agent.linkprobe import LinkProber
from orchestrator.agent.processes import ProcessManager
from orchestrator.agent.schemas import Identity, Report
from orchestrator.agent.server import make_server
from orchestrator.agent.sources import fetch_hub, import_demo
from orchestrator.agent.transfer import Downloads, RateLimiter
from orchestrator.httpkit import Server
from orchestrator.logs import EventLogger

REAPER_INTERVAL_S = 0.25


@dataclass(frozen=True)
class AgentConfig:
    """Everything `pipeserve agent` was told on its command line."""

    name: str
    host: str
    port: int
    models_dir: Path
    state_dir: Path
    memory_budget: int | None = None
    transport_ports: tuple[int, int] = (39600, 39629)
    advertise: bool = True
    advertise_ttl: int = 30
    upload_limit: float | None = None  # bytes/s for serving model files to peers
    stop_timeout_s: float = 10.0  # SIGTERM grace when a lease lapses or the agent stops


class Agent:
    """One node agent. `start()` binds and starts its threads; `shutdown()` undoes it all."""

    def __init__(self, config: AgentConfig, log: EventLogger) -> None:
        self.config = config
        self.log = log
        self.state = AgentState(config.state_dir)
        self.inventory = Inventory(config.models_dir, config.state_dir / "manifests.json", log)
        self.processes = ProcessManager(config.state_dir / "processes", self.inventory, config.transport_ports,
                                        config.host, log)
        self.downloads = Downloads(self.inventory, log, {"hf": partial(fetch_hub, log=log),
                                                         "demo": partial(import_demo, log=log)},
                                   users=self.processes.users)
        self.limiter = RateLimiter(config.upload_limit) if config.upload_limit else None
        # timed layers, per model; never beside a running stage (it would compete with serving)
        self.compute = ComputeProfiler(self.inventory, config.state_dir, log,
                                       serving=lambda: bool(self.processes.pids()))
        self.links = LinkProber(log, netif.interfaces)  # measured links to peers
        self.accelerator = node_report.detect_accelerator()  # fixed for the agent's life
        # so is mlx's backend and its device (asked once, in a child: agent/device_probe.py)
        self.device = device_probe.probe()
        self.runtime = node_report.runtime(self.device)
        self.platform = node_report.platform_facts()  # so is the machine (and its id, read from disk)
        self.server: Server | None = None
        self.advertiser: Advertiser | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        """The bound port (differs from the configured one when that was 0)."""
        return self.server.server_address[1] if self.server else self.config.port

    def identity(self) -> Identity:
        """What the open identity probe tells anyone."""
        return Identity(name=self.config.name, fingerprint=self.state.fingerprint, version=__version__)

    def report(self) -> Report:
        """Everything the control plane plans with."""
        lo, hi = self.config.transport_ports
        return Report(
            name=self.config.name, fingerprint=self.state.fingerprint, version=__version__,
            accelerator=self.accelerator, versions=node_report.versions(), platform=self.platform,
            memory=node_report.memory(self.config.memory_budget, self.processes.rss(), self.device,
                                      self.processes.pids()),
            runtime=self.runtime,
            disk_free_bytes=shutil.disk_usage(self.inventory.root).free,
            transport_ports=node_report.free_ports(self.config.host, lo, hi),
            models=self.inventory.list(), processes=self.processes.list(), downloads=self.downloads.list(),
            interfaces=netif.interfaces(), links=self.links.links(), compute=self.compute.profiles())

    def start(self) -> None:
        """Adopt surviving processes, bind the API, start the reaper (then call `advertise`)."""
        self.processes.adopt()
        self.server = make_server(self)
        serve = partial(self.server.serve_forever, poll_interval=0.05)  # prompt shutdown
        for target, name in ((serve, "http"), (self._reap, "reaper"), (self._measure_links, "links")):
            t = threading.Thread(target=target, daemon=True, name=f"agent-{name}")
            t.start()
            self._threads.append(t)
        self.log.info("agent.listening", url=f"http://{self.config.host}:{self.port}", name=self.config.name,
                      fingerprint=self.state.fingerprint, models_dir=self.inventory.root,
                      accelerator=self.accelerator.family)

    def advertise(self) -> None:
        """Announce the agent on zeroconf when configured to (takes a second or two)."""
        if self.config.advertise:
            self.advertiser = Advertiser(self.config.name, self.state.fingerprint, self.config.host, self.port,
                                         __version__, self.accelerator.family, self.log, self.config.advertise_ttl)
            try:
                self.advertiser.start(self.inventory.ids())
            except Exception as exc:  # noqa: BLE001 (discovery is a convenience: the agent works without it)
                self.log.error("discovery.failed", reason=exc)
                self.advertiser = None

    def _reap(self) -> None:
        """Enforce leases often; refresh the advertised model list now and then."""
        ticks = 0
        while not self._stop.wait(REAPER_INTERVAL_S):
            try:
                self.processes.enforce(self.config.stop_timeout_s)
                ticks += 1
                if self.advertiser is not None and ticks % 8 == 0:
                    self.advertiser.update_models(self.inventory.ids())
            except Exception:  # keep enforcing leases whatever one round hit
                self.log.error("agent.reaper_error", exc_info=True)

    def _measure_links(self) -> None:
        """Re-measure the links to the peers last asked about, when their period is up."""
        while not self._stop.wait(1.0):
            try:
                self.links.tick()
            except Exception:  # a failed round must not end the periodic measurement
                self.log.error("agent.links_error", exc_info=True)

    def wait(self) -> None:
        """Block until `shutdown` is requested (by a signal handler)."""
        while not self._stop.wait(1.0):
            pass

    def request_stop(self) -> None:
        """Ask `wait` to return (safe from a signal handler)."""
        self._stop.set()

    def shutdown(self) -> None:
        """Goodbye on the LAN, stop serving, stop downloads (keeping partial files) and engine processes."""
        self._stop.set()
        if self.advertiser is not None:
            self.advertiser.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self.downloads.shutdown()
        self.processes.stop_all("agent shutdown", self.config.stop_timeout_s)
        self.log.info("agent.stopped")
