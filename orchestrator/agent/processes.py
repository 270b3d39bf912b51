"""Engine processes on this node: start, observe, stop, and stop by themselves when a lease lapses.

Each process is keyed by (cluster id, node id), which makes a retried start harmless: the
same request finds the process it started. A process runs in its own session (process
group), so a stop reaches everything it spawned; its output goes to a file in the state
directory (not a pipe). A lease is renewed by the control plane; when it lapses (the
dashboard died or lost the network) the agent stops the process. An agent that dies without
stopping its processes (SIGKILL, a crash) cannot enforce anything, so each child watches its
parent itself (`orchestrator.engine.parent_watch`, told the agent's pid in its environment)
and stops when the agent is gone. A restarted agent reads the records it left behind,
re-adopts by pid and start time whatever still runs, and reports the rest as exited.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..engine.config import ClusterConfig, ConfigError
from ..engine.parent_watch import PARENT_PID_ENV
from ..logs import EventLogger
from .commands import SECRET_ENV, child_env, pipeserve_command
from .inventory import Inventory
from .probes import port_listening, process_identity as _identity
from .report import process_rss
from .schemas import ProcessInfo, StartProcessRequest
from .state import private_dir, write_private

KEEP_EXITED = 64  # records of exited processes kept for post-mortems


class ProcessError(Exception):
    """A process request cannot be honoured; `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Managed:
    """One engine process and what the agent knows about it; persisted as record.json."""

    cluster_id: str
    node_id: str
    kind: str
    model_id: str
    port: int
    probe_host: str
    spec_sha256: str
    pid: int
    identity: str | None
    started_at: float
    lease_expires_at: float  # unix time (persisted, so a restarted agent keeps enforcing it)
    stop_reason: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    adopted: bool = False
    gone: bool = False
    popen: subprocess.Popen | None = field(default=None, repr=False)
    stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    stopping: bool = False

    def record(self) -> dict:
        """What is persisted."""
        transient = ("popen", "stop_lock", "stopping")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in transient}

    def alive(self) -> bool:
        """Whether the process is still running (reaping and noting its exit when it is not)."""
        if self.gone:
            return False
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return True
            if code >= 0:
                self.exit_code = code
            else:
                try:
                    self.signal = signal.Signals(-code).name
                except ValueError:
                    self.signal = f"signal {-code}"
        else:
            try:
                os.kill(self.pid, 0)
                if _identity(self.pid) == self.identity:
                    return True
            except (ProcessLookupError, PermissionError):
                pass
        self.gone = True
        return False


class ProcessManager:
    """The engine processes of one agent. Thread-safe."""

    def __init__(self, root: Path, inventory: Inventory, port_range: tuple[int, int], agent_host: str,
                 log: EventLogger) -> None:
        self.root = private_dir(root)
        self.inventory = inventory
        self.port_range = port_range
        self.agent_host = agent_host
        self.log = log
        self._procs: dict[tuple[str, str], Managed] = {}
        self._lock = threading.Lock()

    # --- lifecycle -----------------------------------------------------------------

    def adopt(self) -> None:
        """After a restart: take back the processes still running from the previous agent."""
        for path in sorted(self.root.glob("*/*/record.json")):
            try:
                data = json.loads(path.read_text())
                m = Managed(**{k: v for k, v in data.items() if k in Managed.__dataclass_fields__})
            except (OSError, ValueError, TypeError):
                continue
            if not m.gone:
                m.adopted = True
                if not m.alive():
                    m.stop_reason = m.stop_reason or "exited while the agent was down"
                self.log.info("process.adopted" if m.alive() else "process.found_exited",
                              cluster=m.cluster_id, node=m.node_id, pid=m.pid)
            self._procs[(m.cluster_id, m.node_id)] = m
            self._persist(m)

    def start(self, req: StartProcessRequest) -> ProcessInfo:
        """Start `pipeserve stage|coordinator` for the request; an identical running one is returned."""
        config = self._validate(req)
        node = config.node(req.node_id)
        if req.kind == "stage":
            host, port = node.host_port
        else:
            if req.http_port is None:
                raise ProcessError(400, "http_port is required for a coordinator", "invalid_field")
            host, port = req.http_host or self.agent_host, req.http_port
        lo, hi = self.port_range
        if not lo <= port <= hi:
            raise ProcessError(400, f"port {port} is outside this node's transport range {lo}-{hi}", "port_out_of_range")
        model_dir = self.inventory.model_dir(req.model_id)
        spec = req.model_dump()
        spec["secret"] = hashlib.sha256(req.secret.encode()).hexdigest()
        spec.pop("lease_s")
        spec_sha = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
        key = (req.cluster_id, req.node_id)
        with self._lock:
            existing = self._procs.get(key)
            if existing is not None and existing.alive():
                if existing.spec_sha256 != spec_sha:
                    raise ProcessError(409, f"{req.cluster_id}/{req.node_id} is already running with another "
                                            "configuration; stop it first", "process_conflict")
                existing.lease_expires_at = max(existing.lease_expires_at, time.time() + req.lease_s)
                self._persist(existing)
                return self.info(existing)
            m = self._spawn(req, model_dir, host, port, spec_sha)
            self._procs[key] = m
            self._prune()
        self.log.info("process.started", cluster=req.cluster_id, node=req.node_id, kind=req.kind, pid=m.pid,
                      port=port, lease_s=req.lease_s)
        return self.info(m, created=True)

    def _validate(self, req: StartProcessRequest) -> ClusterConfig:
        try:
            data = tomllib.loads(req.config)
            config = ClusterConfig.model_validate(data)
            node = config.node(req.node_id)
        except (ConfigError, ValueError) as exc:  # TOMLDecodeError and pydantic errors are ValueErrors
            raise ProcessError(400, f"config: {exc}", "invalid_config") from None
        if config.cluster.secret_file is not None:
            raise ProcessError(400, "config: secret_file is not accepted; the secret travels in the request",
                               "invalid_config")
        roles = ("pipeline_stage",) if req.kind == "stage" else ("hybrid", "coordinator")
        if node.role not in roles:
            raise ProcessError(400, f"config: node {node.id!r} has role {node.role!r}, which a {req.kind} "
                                    "cannot run", "invalid_config")
        return config

    def _spawn(self, req: StartProcessRequest, model_dir: Path, host: str, port: int, spec_sha: str) -> Managed:
        workdir = private_dir(self.root / req.cluster_id / req.node_id)
        config_path = workdir / "cluster.toml"
        write_private(config_path, req.config)
        log_path = workdir / "output.log"
        if log_path.exists():
            os.replace(log_path, workdir / "output.log.1")
        args = ["--config", str(config_path), "--node-id", req.node_id, "--model", str(model_dir)]
        if req.kind == "stage" and req.threads:
            args += ["--threads", str(req.threads)]
        if req.kind == "coordinator":
            args += ["--host", host, "--port", str(port)] + (["--model-name", req.model_name] if req.model_name else [])
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            popen = subprocess.Popen(pipeserve_command(req.kind, *args), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=child_env({SECRET_ENV: req.secret, PARENT_PID_ENV: str(os.getpid())}),
                                     cwd=workdir, start_new_session=True, close_fds=True)
        finally:
            os.close(out)
        probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        m = Managed(req.cluster_id, req.node_id, req.kind, req.model_id, port, probe, spec_sha, popen.pid,
                    _identity(popen.pid), time.time(), time.time() + req.lease_s, popen=popen)
        try:
            self._persist(m)
        except BaseException:  # an unrecorded process would be an orphan: take it down with the request
            self._signal_group(m, signal.SIGKILL)
            popen.wait()
            raise
        return m

    def _persist(self, m: Managed) -> None:
        workdir = private_dir(self.root / m.cluster_id / m.node_id)
        write_private(workdir / "record.json", json.dumps(m.record()))

    def _prune(self) -> None:
        exited = sorted((m for m in self._procs.values() if m.gone), key=lambda m: m.started_at)
        for m in exited[:-KEEP_EXITED] if len(exited) > KEEP_EXITED else []:
            del self._procs[(m.cluster_id, m.node_id)]
            shutil.rmtree(self.root / m.cluster_id / m.node_id, ignore_errors=True)

    def stop(self, cluster_id: str, node_id: str, timeout_s: float = 10.0, reason: str = "requested") -> ProcessInfo:
        """SIGTERM the process group, SIGKILL after `timeout_s`; returns once it is confirmed gone."""
        m = self._get(cluster_id, node_id)
        with m.stop_lock:
            if m.alive():
                m.stop_reason = m.stop_reason or reason
                self.log.info("process.stopping", cluster=cluster_id, node=node_id, pid=m.pid, reason=reason)
                self._signal_group(m, signal.SIGTERM)
                if not self._wait_gone(m, timeout_s):
                    self.log.warning("process.kill", cluster=cluster_id, node=node_id, pid=m.pid,
                                     reason=f"still running {timeout_s:.0f} s after SIGTERM")
                    self._signal_group(m, signal.SIGKILL)
                    if not self._wait_gone(m, 10.0):
                        raise ProcessError(500, f"pid {m.pid} survived SIGKILL", "stop_failed")
                self._signal_group(m, signal.SIGKILL)  # anything the process left behind in its group
                self.log.info("process.stopped", cluster=cluster_id, node=node_id, exit_code=m.exit_code,
                              signal=m.signal)
            self._persist(m)
        return self.info(m)

    @staticmethod
    def _signal_group(m: Managed, sig: signal.Signals) -> None:
        try:
            os.killpg(m.pid, sig)  # start_new_session made the process its group's leader
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _wait_gone(m: Managed, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while m.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stop_all(self, reason: str, timeout_s: float = 10.0) -> None:
        """Stop every running process in parallel (agent shutdown)."""
        with self._lock:
            keys = [k for k, m in self._procs.items() if m.alive()]
        threads = [threading.Thread(target=self._stop_quietly, args=(*k, timeout_s, reason)) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _stop_quietly(self, cluster_id: str, node_id: str, timeout_s: float, reason: str) -> None:
        try:
            self.stop(cluster_id, node_id, timeout_s, reason)
        except Exception:  # logged: one failed stop must not keep the others from running
            self.log.error("process.stop_failed", exc_info=True, cluster=cluster_id, node=node_id)
        finally:
            m = self._procs.get((cluster_id, node_id))
            if m is not None:
                m.stopping = False

    # --- leases --------------------------------------------------------------------

    def renew(self, cluster_id: str, lease_s: float) -> list[str]:
        """Extend the lease of the cluster's running processes; LookupError when none runs."""
        renewed = []
        with self._lock:
            for (cid, nid), m in self._procs.items():
                if cid == cluster_id and m.alive() and not m.stopping:
                    m.lease_expires_at = time.time() + lease_s
                    self._persist(m)
                    renewed.append(nid)
        if not renewed:
            raise LookupError(f"no running process of cluster {cluster_id!r} on this node")
        return renewed

    def enforce(self, timeout_s: float = 10.0) -> None:
        """Stop processes whose lease lapsed (called periodically by the agent's reaper thread)."""
        now = time.time()
        with self._lock:
            due = [m for m in self._procs.values() if not m.stopping and m.lease_expires_at <= now and m.alive()]
            for m in due:
                m.stopping = True
        for m in due:
            self.log.warning("lease.expired", cluster=m.cluster_id, node=m.node_id, pid=m.pid)
            threading.Thread(target=self._stop_quietly, args=(m.cluster_id, m.node_id, timeout_s, "lease expired"),
                             daemon=True, name=f"stop-{m.node_id}").start()

    # --- observation ---------------------------------------------------------------

    def _get(self, cluster_id: str, node_id: str) -> Managed:
        with self._lock:
            m = self._procs.get((cluster_id, node_id))
        if m is None:
            raise LookupError(f"no process {cluster_id}/{node_id} on this node")
        return m

    def get(self, cluster_id: str, node_id: str) -> ProcessInfo:
        """One process's status; LookupError when unknown."""
        return self.info(self._get(cluster_id, node_id))

    def list(self) -> list[ProcessInfo]:
        """Every known process, running or not."""
        with self._lock:
            procs = list(self._procs.values())
        return [self.info(m) for m in procs]

    def info(self, m: Managed, created: bool = False) -> ProcessInfo:
        """A process's status, probing its port."""
        alive = m.alive()
        listening = alive and port_listening(m.probe_host, m.port, m.pid)
        return ProcessInfo(cluster_id=m.cluster_id, node_id=m.node_id, kind=m.kind, model_id=m.model_id, pid=m.pid,
                           alive=alive, exit_code=m.exit_code, signal=m.signal, port=m.port, port_listening=listening,
                           started_at=m.started_at, uptime_s=round(time.time() - m.started_at, 3),
                           lease_remaining_s=round(m.lease_expires_at - time.time(), 3) if alive else None,
                           stop_reason=m.stop_reason, adopted=m.adopted, created=created)

    def logs(self, cluster_id: str, node_id: str, lines: int = 100) -> list[str]:
        """The last `lines` lines the process printed (stdout and stderr together)."""
        m = self._get(cluster_id, node_id)
        path = self.root / m.cluster_id / m.node_id / "output.log"
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 256 * lines - 4096))
                data = f.read()
        except OSError:
            return []
        return data.decode(errors="replace").splitlines()[-lines:]

    def users(self, model_id: str) -> list[str]:
        """"cluster/node" of the running processes that use this model."""
        with self._lock:
            procs = list(self._procs.values())
        return [f"{m.cluster_id}/{m.node_id}" for m in procs if m.model_id == model_id and m.alive()]

    def rss(self) -> int:
        """Resident bytes of all running engine processes."""
        with self._lock:
            pids = [m.pid for m in self._procs.values() if m.alive()]
        return sum(process_rss(p) for p in pids)
