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
import threading
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from orchestrator.agent.identity import private_dir
from orchestrator.agent.inventory import Inventory
from orchestrator.agent.probes import port_listening
from orchestrator.agent.probes import process_identity as _identity
from orchestrator.agent.programs import SECRET_ENV, child_env, pipeserve_command
from orchestrator.agent.report import process_rss
from orchestrator.agent.schemas import ProcessInfo, StartProcessRequest
from orchestrator.atomic_write import write_atomically
from orchestrator.engine.config import ClusterConfig, ConfigError
from orchestrator.logs import EventLogger
from orchestrator.proc import SYSTEM_CLOCK, ChildError, ChildProcess, Clock, ProcState
from orchestrator.proc.cputime import cpu_seconds

KEEP_EXITED = 64  # records of exited processes kept for post-mortems


class ProcessError(Exception):
    """A process request cannot be honoured; `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Managed:
    """One engine process and what the agent knows about it; persisted as record.json.

    Its life is `child.state` (running, stopping, exited, vanished); `stop_reason` says why
    it was stopped, when the agent stopped it or found it gone after a restart.
    """

    cluster_id: str
    node_id: str
    kind: str
    model_id: str
    port: int
    probe_host: str
    spec_sha256: str
    started_at: float
    lease_expires_at: float  # unix time (persisted, so a restarted agent keeps enforcing it)
    child: ChildProcess = field(repr=False)
    stop_reason: str | None = None
    stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one stop at a time

    @property
    def adopted(self) -> bool:
        """Found after an agent restart (no exit status will be known), still running or not."""
        return self.child.attached and self.child.state is not ProcState.EXITED

    def record(self) -> dict:
        """What is persisted."""
        c = self.child
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("child", "stop_lock")}
        return {**data, "pid": c.pid, "identity": c.identity, "state": c.state.value, "exit_code": c.exit_code,
                "signal": c.signal}

    @classmethod
    def from_record(cls, data: dict, log_path: Path, clock: Clock) -> "Managed":
        """A record written by an earlier run: its process is attached by pid and identity."""
        state = data.get("state") or ("exited" if data.get("gone") else "running")  # records before `state`
        child = ChildProcess.attach(data["node_id"], int(data["pid"]), data.get("identity"), _identity,
                                    log_path=log_path, clock=clock)
        child.state, child.exit_code, child.signal = ProcState(state), data.get("exit_code"), data.get("signal")
        own = {f.name for f in fields(cls)} - {"child", "stop_lock"}
        return cls(**{k: v for k, v in data.items() if k in own}, child=child)

    def alive(self) -> bool:
        """Whether the process is still running (noting its exit when it is not)."""
        return self.child.alive()


class ProcessManager:
    """The engine processes of one agent. Thread-safe."""

    def __init__(self, root: Path, inventory: Inventory, port_range: tuple[int, int], agent_host: str,
                 log: EventLogger, clock: Clock = SYSTEM_CLOCK) -> None:
        self.root = private_dir(root)
        self.clock = clock  # leases and uptimes: a test moves a fake one instead of waiting
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
                m = Managed.from_record(json.loads(path.read_text()), path.parent / "output.log", self.clock)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if not m.child.state.gone:
                m.child.release_stop()  # a stop the previous agent began is no longer under way
                if not m.alive():
                    m.stop_reason = m.stop_reason or "exited while the agent was down"
                self.log.info("process.adopted" if m.alive() else "process.found_exited",
                              cluster=m.cluster_id, node=m.node_id, pid=m.child.pid)
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
            raise ProcessError(400, f"port {port} is outside this node's transport range {lo}-{hi}",
                               "port_out_of_range")
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
                existing.lease_expires_at = max(existing.lease_expires_at, self.clock.time() + req.lease_s)
                self._persist(existing)
                return self.info(existing)
            m = self._spawn(req, model_dir, host, port, spec_sha)
            self._procs[key] = m
            self._prune()
        self.log.info("process.started", cluster=req.cluster_id, node=req.node_id, kind=req.kind, pid=m.child.pid,
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
        write_atomically(config_path, req.config)
        log_path = workdir / "output.log"
        if log_path.exists():
            os.replace(log_path, workdir / "output.log.prev")  # .1 is the size rotation's (log_limits)
        args = ["--config", str(config_path), "--node-id", req.node_id, "--model", str(model_dir)]
        if req.kind == "stage" and req.threads:
            args += ["--threads", str(req.threads)]
        if req.kind == "coordinator":
            args += ["--host", host, "--port", str(port)] + (["--model-name", req.model_name] if req.model_name else [])
        env = child_env({SECRET_ENV: req.secret})
        child = ChildProcess.spawn(req.node_id, pipeserve_command(req.kind, *args), log_path, env=env, cwd=workdir,
                                   clock=self.clock)
        child.identity = _identity(child.pid)  # persisted: how a restarted agent recognises it
        probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        now = self.clock.time()
        m = Managed(req.cluster_id, req.node_id, req.kind, req.model_id, port, probe, spec_sha, now,
                    now + req.lease_s, child)
        try:
            self._persist(m)
        except BaseException:  # an unrecorded process would be an orphan: take it down with the request
            child.signal_group(signal.SIGKILL)
            child.wait_exit(10.0)
            raise
        return m

    def _persist(self, m: Managed) -> None:
        workdir = private_dir(self.root / m.cluster_id / m.node_id)
        write_atomically(workdir / "record.json", json.dumps(m.record()))

    def _prune(self) -> None:
        exited = sorted((m for m in self._procs.values() if m.child.state.gone), key=lambda m: m.started_at)
        for m in exited[:-KEEP_EXITED] if len(exited) > KEEP_EXITED else []:
            del self._procs[(m.cluster_id, m.node_id)]
            shutil.rmtree(self.root / m.cluster_id / m.node_id, ignore_errors=True)

    def stop(self, cluster_id: str, node_id: str, timeout_s: float = 10.0, reason: str = "requested") -> ProcessInfo:
        """SIGTERM the process group, SIGKILL after `timeout_s`; returns once it is confirmed gone."""
        m = self._get(cluster_id, node_id)
        with m.stop_lock:
            if m.alive():
                m.stop_reason = m.stop_reason or reason
                self.log.info("process.stopping", cluster=cluster_id, node=node_id, pid=m.child.pid, reason=reason)

                def killing() -> None:
                    self.log.warning("process.kill", cluster=cluster_id, node=node_id, pid=m.child.pid,
                                     reason=f"still running {timeout_s:.0f} s after SIGTERM")

                try:
                    m.child.stop(timeout_s, on_kill=killing)
                except ChildError:
                    raise ProcessError(500, f"pid {m.child.pid} survived SIGKILL", "stop_failed") from None
                self.log.info("process.stopped", cluster=cluster_id, node=node_id, exit_code=m.child.exit_code,
                              signal=m.child.signal)
            self._persist(m)
        return self.info(m)

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
                m.child.release_stop()  # a failed stop leaves it running: the next check may retry

    # --- leases --------------------------------------------------------------------

    def renew(self, cluster_id: str, lease_s: float) -> list[str]:
        """Extend the lease of the cluster's running processes; LookupError when none runs."""
        renewed = []
        with self._lock:
            for (cid, nid), m in self._procs.items():
                if cid == cluster_id and m.child.state is ProcState.RUNNING and m.alive():
                    m.lease_expires_at = self.clock.time() + lease_s
                    self._persist(m)
                    renewed.append(nid)
        if not renewed:
            raise LookupError(f"no running process of cluster {cluster_id!r} on this node")
        return renewed

    def enforce(self, timeout_s: float = 10.0) -> list[threading.Thread]:
        """Stop processes whose lease lapsed (called periodically by the agent's reaper thread).

        Each stop runs in a thread of its own (a stop may take `timeout_s`); they are returned.
        """
        now = self.clock.time()
        with self._lock:
            # claim_stop: a process already being stopped is not stopped twice, nor renewed meanwhile
            due = [m for m in self._procs.values() if m.lease_expires_at <= now and m.child.claim_stop()]
        threads = []
        for m in due:
            self.log.warning("lease.expired", cluster=m.cluster_id, node=m.node_id, pid=m.child.pid)
            threads.append(threading.Thread(target=self._stop_quietly, daemon=True, name=f"stop-{m.node_id}",
                                            args=(m.cluster_id, m.node_id, timeout_s, "lease expired")))
            threads[-1].start()
        return threads

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
        alive, c, now = m.alive(), m.child, self.clock.time()
        listening = alive and port_listening(m.probe_host, m.port, c.pid)
        return ProcessInfo(cluster_id=m.cluster_id, node_id=m.node_id, kind=m.kind, model_id=m.model_id, pid=c.pid,
                           alive=alive, exit_code=c.exit_code, signal=c.signal, port=m.port, port_listening=listening,
                           started_at=m.started_at, uptime_s=round(now - m.started_at, 3),
                           lease_remaining_s=round(m.lease_expires_at - now, 3) if alive else None,
                           stop_reason=m.stop_reason, adopted=m.adopted, created=created,
                           cpu_s=cpu_seconds(c.pid) if alive else None)

    def logs(self, cluster_id: str, node_id: str, lines: int = 100) -> list[str]:
        """The last `lines` lines the process printed (stdout and stderr together)."""
        return self._get(cluster_id, node_id).child.output_lines(lines)

    def users(self, model_id: str) -> list[str]:
        """"cluster/node" of the running processes that use this model."""
        with self._lock:
            procs = list(self._procs.values())
        return [f"{m.cluster_id}/{m.node_id}" for m in procs if m.model_id == model_id and m.alive()]

    def pids(self) -> list[int]:
        """The pids of the running engine processes."""
        with self._lock:
            return [m.child.pid for m in self._procs.values() if m.alive()]

    def rss(self) -> int:
        """Resident bytes of all running engine processes."""
        return sum(process_rss(p) for p in self.pids())
