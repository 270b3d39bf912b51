"""The systems of the emulated-node benchmark, each an OpenAI-compatible server whose processes are
pinned like nodes (`pinning`): one core per node, one BLAS thread per process.

* `OneNode`: `mlx_lm.server` on one core (node 0): the single-node baseline, with its own batch
  generator (concurrent requests prefill and decode together).
* `Pipeserve`: `LocalPipeline` with 2 stages; stage k on core k, the coordinator beside stage 0.
* `MlxPipeline`: mlx-lm's own pipeline (`mlx.launch --backend ring -n 2 --hosts 127.0.0.1 ...
  -m mlx_lm.server --pipeline`); its rank 1 holds the first layers (core 0), rank 0 the last ones and
  the HTTP server (core 1). Its idle rank busy-polls its socket, so it is stopped (SIGSTOP to its process
  group) while the others are measured; the launcher's own threads, which spin forwarding the ranks'
  output, run SCHED_IDLE (`idle_launcher`). SIGTERM to `mlx.launch` leaves the ranks running: the whole
  process group is signalled.

The peers get the same BLAS as the stages: OpenBLAS (`orchestrator.engine.blas.find_openblas`) loaded
first by `LD_PRELOAD` (the mlx-cpu wheel's own BLAS is ~25x slower), `OPENBLAS_NUM_THREADS=1`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from e2e.bench.client import get_json
from e2e.bench.pinning import affinity, descendants, pin
from orchestrator.proc import free_port

READY_TIMEOUT_S = 600.0  # a 2-core machine shared with other users loads slowly
ROOT = Path(__file__).resolve().parents[2]


def blas_env() -> dict[str, str]:
    """Environment of a peer's processes: OpenBLAS loaded first, one thread."""
    from orchestrator.engine import blas

    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    lib = blas.find_openblas()
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    return env


def uses_openblas(pid: int) -> bool:
    """Whether process `pid` has OpenBLAS mapped."""
    try:
        return "libopenblas" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class Server:
    """A started server: its port, the served model name, the processes to pin and count."""

    key = ""
    label = ""
    host = "127.0.0.1"
    port = 0
    model_name = ""

    def pids(self) -> list[int]:
        """Every process of the system."""
        raise NotImplementedError

    def pin(self) -> None:
        """(Re)apply the node pinning to every thread."""

    def pinning(self) -> str:
        """Process -> cores, as pinned now (for the table)."""
        return ", ".join(f"{name}: {sorted(affinity(pid))}" for name, pid in self.named().items())

    def named(self) -> dict[str, int]:
        """Process name -> pid (the processes that compute)."""
        raise NotImplementedError

    def blas(self) -> str:
        """"OpenBLAS" when every computing process has it mapped."""
        return "OpenBLAS" if all(uses_openblas(p) for p in self.named().values()) else "NOT OpenBLAS"

    def active(self) -> None:
        """About to be measured."""
        self.pin()

    def idle(self) -> None:
        """Another system is measured now."""

    def stop(self) -> None:
        """Stop every process."""
        raise NotImplementedError


def _wait_http(port: int, proc: subprocess.Popen, log: Path, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode} at start; see {log}:\n{log.read_text()[-2000:]}")
        try:
            get_json(port, "/health")  # both servers answer it (mlx_lm.server's /v1/models scans a hub cache)
            return
        except (OSError, ValueError):
            time.sleep(0.5)
    raise RuntimeError(f"no answer on :{port} after {timeout:.0f} s; see {log}")


class _ProcessGroup(Server):
    """A server started as one process group (its own session)."""

    proc: subprocess.Popen

    def _start(self, argv: list[str], cores: set[int], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **blas_env()}, cwd=log.parent, start_new_session=True,
                                         preexec_fn=lambda: os.sched_setaffinity(0, cores))

    def pids(self) -> list[int]:
        return descendants(self.proc.pid)

    def stop(self) -> None:
        for sig, wait in ((signal.SIGCONT, 0.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait) if wait else None
            except subprocess.TimeoutExpired:
                continue
            if wait and not any(Path(f"/proc/{p}").exists() for p in self.pids()[1:]):
                return


class OneNode(_ProcessGroup):
    """`mlx_lm.server` on one core."""

    key, label = "node", "one node: mlx_lm.server, 1 core"

    def __init__(self, model_dir: Path, model_name: str, core: int, workdir: Path) -> None:
        self.port, self.model_name, self.core = free_port(), str(model_dir), core
        self._start([sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--port", str(self.port),
                     "--log-level", "WARNING"], {core}, workdir / "mlx_lm_server.log")
        _wait_http(self.port, self.proc, self.log)

    def named(self) -> dict[str, int]:
        return {"server": self.proc.pid}

    def pin(self) -> None:
        pin(self.proc.pid, {self.core})


class MlxPipeline(_ProcessGroup):
    """mlx-lm's pipeline over 2 ranks on the ring backend, ranks pinned like the stages."""

    key, label = "mlxpipe", "mlx-lm pipeline (ring, 2 ranks × 1 core)"

    def __init__(self, model_dir: Path, model_name: str, cores: list[int], workdir: Path) -> None:
        self.port, self.model_name = free_port(), str(model_dir)
        # rank 1 holds the first layers (stage 0's core), rank 0 the last ones and the HTTP server
        self.rank_core = {1: cores[0], 0: cores[1]}
        ring = free_port()
        launch = Path(sys.executable).with_name("mlx.launch")
        self._start([str(launch), "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1", "--starting-port",
                     str(ring), "--env", "OPENBLAS_NUM_THREADS=1", "--", sys.executable, "-m", "mlx_lm.server",
                     "--pipeline", "--model", str(model_dir), "--port", str(self.port), "--log-level", "WARNING"],
                    set(cores), workdir / "mlx_launch.log")
        deadline = time.monotonic() + 60
        while len(self.ranks()) < 2 and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        self.pin()
        _wait_http(self.port, self.proc, self.log)
        self.pin()

    def ranks(self) -> dict[int, int]:
        """Rank -> pid, read from each process's MLX_RANK."""
        out = {}
        for pid in self.pids():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            rank = next((int(e[9:]) for e in env if e.startswith(b"MLX_RANK=")), None)
            if rank is not None and b"mlx_lm.server" in cmd and b"python" in cmd.split(b"\0")[0]:
                out[rank] = pid
        return out

    def named(self) -> dict[str, int]:
        return {f"rank {r}": pid for r, pid in sorted(self.ranks().items())}

    def pin(self) -> None:
        ranks = self.ranks()
        pin(self.proc.pid, {self.rank_core[0]})  # the launcher: beside the HTTP rank
        for rank, pid in ranks.items():
            pin(pid, {self.rank_core[rank]})
        if len(ranks) == 2:
            idle_launcher(self.proc.pid)

    def active(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)  # the launcher and both ranks
        self.pin()

    def idle(self) -> None:
        # its idle rank busy-polls the ring, and the launcher spins: stopped, they take no core
        os.killpg(self.proc.pid, signal.SIGSTOP)


def idle_launcher(pid: int) -> None:
    """Give `mlx.launch`'s own threads (not its ranks) the SCHED_IDLE policy.

    Its per-rank threads forward the ranks' output with `select` on the rank's stdin as well, which is
    always writable, so they never sleep: about 0.3 of a core on a rank's core, taken from mlx-lm's
    serving by a log forwarder that a cluster would not run on a serving node. SCHED_IDLE runs them
    only when the core has nothing else to do. Set after the ranks are started (children inherit it)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass


class Pipeserve(Server):
    """pipeserve's 2-stage `LocalPipeline`: stage k on core k, the coordinator beside stage 0. With `lan`
    (an `e2e.lan.netns.Lan`), each stage in its node's network namespace, so every boundary and the return
    path cross the emulated link (`LanPipelineSystem`; the caller has joined the LAN's control namespace)."""

    key, label = "pipeserve", "pipeserve, 2 stages × 1 core"

    def __init__(self, model_dir: Path, model_name: str, cores: list[int], workdir: Path,
                 splits: list[tuple[int, int]], cluster: dict[str, object] | None = None, lan: Any = None,
                 batched: bool = False, pipelined: bool = False) -> None:
        from e2e.bench.procs import PipelineSystem

        self.cores, self.model_name = cores, model_name
        env = {"OPENBLAS_NUM_THREADS": "1", "PIPESERVE_BLAS": "openblas"}
        if pipelined:  # a prompt cut into about 4 equal chunks per stage (PIPESERVE_PREFILL_CHUNKS, prefill_plan.py)
            env["PIPESERVE_PREFILL_CHUNKS"] = "pipelined"
            self.key, self.label = "pipelined", "pipeserve, pipelined prefill, 2 stages × 1 core"
        if batched:  # concurrent prompts prefilled together (PIPESERVE_PREFILL_BATCH, prefill_batch.py); with
            # the pipelined cut a batch goes in pieces, so stage 1 starts on it before stage 0 is through
            env["PIPESERVE_PREFILL_BATCH"] = "batched"
            cut = " (pipelined cut)" if pipelined else ""
            self.key, self.label = "batched", f"pipeserve, batched prefill{cut}, 2 stages × 1 core"
        # prompt cache off: every measurement is a cold prefill (prompts are unique as well)
        cluster = {"prompt_cache_bytes": 0, **(cluster or {})}
        if lan is None:
            self.system = PipelineSystem(model_dir, workdir, splits, 1, None, env, model_name, cluster)
            self._procs = lambda: self.system.procs
        else:
            from e2e.bench.lan_pipeline import LanPipelineSystem

            self.label += f", over {lan.profile.name}"
            self.system = LanPipelineSystem(lan, model_dir, workdir, splits, 1, env, model_name, cluster,
                                            port_base=free_port())
            self.host = self.system.host
            self._procs = lambda: {c.name: c.pid for c in self.system.children}
        self.port = self.system.port
        self.pin()

    def named(self) -> dict[str, int]:
        return self._procs()

    def pids(self) -> list[int]:
        return [p for pid in self.named().values() for p in descendants(pid)]

    def blas(self) -> str:
        """The stages' BLAS (the coordinator computes no layer and loads none)."""
        stages = [pid for name, pid in self.named().items() if name.startswith("stage-")]
        return "OpenBLAS" if all(uses_openblas(p) for p in stages) else "NOT OpenBLAS"

    def pin(self) -> None:
        for name, pid in self.named().items():
            pin(pid, {self.cores[1]} if name == "stage-1" else {self.cores[0]})

    def stop(self) -> None:
        self.system.stop()
