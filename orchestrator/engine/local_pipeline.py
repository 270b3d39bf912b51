"""Run a whole pipeline on this machine: stage processes plus (optionally) a coordinator.

Used by the benchmarks and the tests. It writes the cluster TOML, starts the stages in
ascending order, waits for each port, starts the coordinator and waits until it is healthy;
on any failure it stops what it started and raises with the child's output. The processes
themselves are `orchestrator.proc.ChildProcess`es.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import requests

from orchestrator import settings
from orchestrator.families.decoder_config import decoder_view, layer_count
from orchestrator.proc import ChildError, ChildProcess, free_port


class LaunchError(RuntimeError):
    """A process of the local pipeline failed to start; the message includes its output."""


def even_split(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Inclusive (first, last) layer ranges of near-equal length."""
    base, extra = divmod(num_layers, stages)
    out, start = [], 0
    for k in range(stages):
        n = base + (1 if k < extra else 0)
        out.append((start, start + n - 1))
        start += n
    return out


def compute_split(config: dict, stages: int) -> list[tuple[int, int]]:
    """Inclusive layer ranges balancing per-token compute, counting the head on the last stage.

    The head (vocab x hidden) costs as much as several layers (SmolLM2: about eight), so an
    even split by layer count leaves the last stage the slowest. The control plane's planner
    balances by bytes and node memory; this is the same idea for one machine.
    """
    config = decoder_view(config)  # multimodal checkpoints nest the decoder's keys
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    per_layer = (2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
                 + 3 * hidden * int(config["intermediate_size"]))
    head = int(config["vocab_size"]) * hidden / per_layer  # in layer units
    n = layer_count(config) or 0
    target = (n + head) / stages
    bounds, start = [], 0
    for k in range(stages - 1):
        remaining = stages - k - 1
        end = max(start + 1, min(round(start + target), n - remaining))
        bounds.append((start, end - 1))
        start = end
    bounds.append((start, n - 1))
    return bounds


def write_config(path: Path, name: str, splits: list[tuple[int, int]], ports: list[int],
                 host: str | list[str] = "127.0.0.1", **cluster: object) -> Path:
    """Write a cluster TOML (docs/architecture.md, "Cluster configuration"): stages on `ports[1:]`, coordinator on
    `ports[0]`; every node at `host`, or at `host[i]` beside `ports[i]` (each node at its own address)."""
    hosts = [host] * len(ports) if isinstance(host, str) else host
    extra = "".join(f"{k} = {v!r}\n" if not isinstance(v, bool) else f"{k} = {str(v).lower()}\n"
                    for k, v in cluster.items())
    text = (f'[cluster]\nname = "{name}"\npipeline_parallel_size = {len(splits)}\ntensor_parallel_size = 1\n'
            f'transport_backend = "tcp"\n{extra}\n'
            f'[[nodes]]\nid = "coordinator"\naddress = "{hosts[0]}:{ports[0]}"\nrole = "hybrid"\n')
    for k, (first, last) in enumerate(splits):
        text += (f'\n[[nodes]]\nid = "stage-{k}"\naddress = "{hosts[k + 1]}:{ports[k + 1]}"\nrole = "pipeline_stage"\n'
                 f'stage = {k}\nlayers = "{first}-{last}"\n')
    path.write_text(text)
    return path


BIND_ATTEMPTS = 3  # starts on fresh ports when a port was taken before a child bound it


@dataclass
class LocalPipeline:
    """A running local pipeline; use as a context manager or call `stop()`."""

    workdir: Path
    model_dir: Path
    splits: list[tuple[int, int]]
    coordinator: bool = True
    threads: int | None = None
    solo_threads: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    cluster: dict[str, object] = field(default_factory=dict)
    startup_timeout: float = 120.0
    model_name: str | None = None
    procs: dict[str, ChildProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._args: dict[str, list[str]] = {}  # each child's command line, for `respawn`
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.secret = secrets.token_hex(16)
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.ports = [free_port() for _ in range(len(self.splits) + 1)]
        self.http_port = free_port()
        self.config_path = write_config(self.workdir / "cluster.toml", "local", self.splits, self.ports, **self.cluster)

    @property
    def base_url(self) -> str:
        """The coordinator's HTTP root."""
        return f"http://127.0.0.1:{self.http_port}"

    def child_env(self) -> dict[str, str]:
        """Environment of the children: the secret travels here, never on the command line. They watch
        this process as an agent's watch their agent (engine/parent_watch.py): a test or benchmark
        killed before its `stop()` leaves no stage running."""
        return {**settings.process_environment(), settings.PARENT_PID.name: str(os.getpid()), **self.env,
                settings.CLUSTER_SECRET.name: self.secret, "PYTHONUNBUFFERED": "1"}

    def start(self) -> "LocalPipeline":
        """Start stages in order, then the coordinator; raises LaunchError with output on failure.
        A port taken by another process between picking it and binding it (other test suites on
        the machine) is not this pipeline's failure: it starts again on fresh ports, twice at most."""
        for attempt in range(BIND_ATTEMPTS):
            try:
                return self._start_once()
            except LaunchError as exc:
                if "Address already in use" not in str(exc) or attempt == BIND_ATTEMPTS - 1:
                    raise
                self.procs = {}
                self._pick_ports()
        raise AssertionError("unreachable")

    def _start_once(self) -> "LocalPipeline":
        try:
            for k in range(len(self.splits)):
                self._spawn(f"stage-{k}", ["stage", "--config", str(self.config_path), "--node-id", f"stage-{k}",
                                           "--model", str(self.model_dir)]
                            + (["--threads", str(self.threads)] if self.threads else [])
                            + (["--solo-threads", str(self.solo_threads)] if self.solo_threads else []))
                self._wait_port(f"stage-{k}", self.ports[k + 1])
            if self.coordinator:
                self._spawn("coordinator", ["coordinator", "--config", str(self.config_path), "--node-id",
                                            "coordinator", "--model", str(self.model_dir),
                                            "--port", str(self.http_port)]
                            + (["--model-name", self.model_name] if self.model_name else []))
                self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        self._args[name] = args
        self.procs[name] = ChildProcess.spawn(name, [sys.executable, "-m", "orchestrator.cli", *args],
                                              self.workdir / f"{name}.log", env=self.child_env())

    def respawn(self, name: str) -> None:
        """Start a stage again on its address, as it was started (after a test killed it), and wait
        until it listens; the coordinator's link reconnects by itself. Its earlier output is kept
        beside the new log."""
        old = self.procs[name]
        old.stop(5.0)
        log = self.workdir / f"{name}.log"
        if log.exists():
            log.rename(self.workdir / f"{name}.{old.pid}.log")
        self._spawn(name, self._args[name])
        self._wait_port(name, self.ports[int(name.rsplit("-", 1)[1]) + 1])

    def output(self, name: str, tail: int = 40) -> str:
        """The last lines a child printed."""
        return self.procs[name].output(tail)

    def _wait_port(self, name: str, port: int) -> None:
        def listening() -> bool:
            # its own word first: another process listening on a port the stage failed to bind
            # would answer the connect (the stage exits with "Address already in use": start again)
            if not self.procs[name].printed(r"(transport\.listening|http\.bound)"):  # a stage's, a coordinator's
                return False
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True

        try:
            self.procs[name].wait_ready(listening, f"a listener on port {port}", self.startup_timeout,
                                        ignore=(OSError,))
        except ChildError as exc:
            raise LaunchError(str(exc)) from None

    def wait_ready(self, timeout: float | None = None) -> dict:
        """Wait until GET /health says ready; returns the health document."""
        last: dict = {}

        def ready() -> dict | None:
            r = requests.get(self.base_url + "/health", timeout=2)
            last.update(r.json())
            return last if r.status_code == 200 and last.get("ready") else None

        try:
            return self.procs["coordinator"].wait_ready(ready, "a ready /health", timeout or self.startup_timeout,
                                                        ignore=(requests.RequestException, ValueError))
        except ChildError as exc:
            raise LaunchError(f"coordinator not healthy: {last}\n{exc}") from None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to one child (tests use it to simulate a dead or frozen stage)."""
        self.procs[name].send(sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every child in reverse start order: SIGTERM, then SIGKILL after `timeout` s."""
        for name in reversed(list(self.procs)):
            self.procs[name].stop(timeout)

    def __enter__(self) -> "LocalPipeline":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
