"""The systems under test as the benchmark process sees them, and /proc and `ss` readings.

A single-process mlx-lm worker (`ReferenceWorker`, driven over pipes) and a whole
pipeline (`PipelineSystem`, which is `orchestrator.engine.local_pipeline.LocalPipeline`: it writes
the cluster TOML, starts the stages and the coordinator and stops them). Worker command
lines come from `worker.argv`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from e2e.bench import worker
from e2e.bench.client import get_json

ROOT = Path(__file__).resolve().parents[2]


def prepare_model(which: str) -> Path:
    """Import or generate benchmark model `which` in a worker subprocess; return its directory.

    A subprocess, so that the benchmark process never imports MLX nor keeps a model's
    memory (the systems under test share this machine with it)."""
    res = subprocess.run(worker.argv("prepare", which), capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"preparing {which} failed:\n{res.stderr[-3000:]}")
    return Path(res.stdout.strip().splitlines()[-1])


def model_parser(doc: str) -> argparse.ArgumentParser:
    """A bench's command line: its docstring's first paragraph, and `--model` (a benchmark model, `prepare_model`)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="benchmark model (default: the demo's SmolLM2)")
    return p


def whole_model_stage(model_dir: Path):
    """One StageModel over all of `model_dir`'s layers, in this process (an in-process timing bench:
    call after `blas.preload`)."""
    from orchestrator.engine.stage.shard import StageModel, read_config

    return StageModel(model_dir, 0, int(read_config(model_dir)["num_hidden_layers"]))


class ReferenceWorker:
    """A single-process mlx-lm worker subprocess (model loaded once, driven over pipes)."""

    def __init__(self, model_dir: Path, env: dict[str, str], log: Path) -> None:
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(worker.argv("reference", str(model_dir)), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env={**os.environ, **env}, text=True,
                                     bufsize=1, cwd=ROOT)
        self.info = self._read()
        if not self.info.get("ready"):
            raise RuntimeError(f"reference worker failed: {self.info}")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(5)
            raise RuntimeError(f"reference worker exited {self.proc.returncode}; see {self.log.name}")
        return json.loads(line)

    def call(self, op: str, **kw: Any) -> dict:
        """Send one command and return its reply (raises on a reported error)."""
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        res = self._read()
        if "error" in res:
            raise RuntimeError(f"reference worker: {res['error']}")
        return res

    @property
    def procs(self) -> dict[str, int]:
        """Process name -> pid."""
        return {"single": self.proc.pid}

    def stop(self) -> None:
        """Close its stdin (it exits), kill it if it does not."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class PipelineSystem:
    """A LocalPipeline (stages + coordinator) driven through its HTTP API."""

    host = "127.0.0.1"

    def __init__(self, model_dir: Path, workdir: Path, splits: list[tuple[int, int]], threads: int,
                 solo_threads: int | None, env: dict[str, str], model_name: str,
                 cluster: dict[str, object] | None = None) -> None:
        from orchestrator.engine.local_pipeline import LocalPipeline

        self.model_name = model_name
        self.lp = LocalPipeline(workdir, model_dir, splits, threads=threads, solo_threads=solo_threads, env=env,
                                cluster=dict(cluster or {}), model_name=model_name)
        self.lp.start()
        self.port = self.lp.http_port

    @property
    def procs(self) -> dict[str, int]:
        """Process name (stage-0, stage-1, coordinator) -> pid."""
        return {name: p.pid for name, p in self.lp.procs.items()}

    def health(self) -> dict:
        """The coordinator's GET /health document (per-stage step_ms, batch, memory)."""
        return get_json(self.port, "/health")

    def counters(self) -> dict[str, int]:
        """Kernel byte counters of the stage-0 -> stage-1 link and the stage-1 <-> coordinator link."""
        pid = self.procs
        p1 = self.lp.ports[2]
        socks = ss_sockets()
        fwd = [s for s in socks if pid["stage-0"] in s["pids"] and s["peer"] == p1]
        coord_side = [s for s in socks if pid["coordinator"] in s["pids"] and s["peer"] == p1]
        if len(fwd) != 1 or len(coord_side) != 1:
            raise RuntimeError(f"could not find the stage links in `ss` output ({len(fwd)}, {len(coord_side)})")
        ret = [s for s in socks if pid["stage-1"] in s["pids"] and s["local"] == p1
               and s["peer"] == coord_side[0]["local"]]
        if len(ret) != 1:
            raise RuntimeError("could not find the stage-1 -> coordinator socket in `ss` output")
        return {"fwd_bytes": fwd[0].get("bytes_sent", 0), "fwd_segs": fwd[0].get("data_segs_out", 0),
                "ret_bytes": ret[0].get("bytes_sent", 0), "ret_segs": ret[0].get("data_segs_out", 0),
                # the coordinator sends stage 1 nothing but 36-byte PINGs; each is answered by a PONG
                "pings": coord_side[0].get("bytes_sent", 0)}

    def stop(self) -> None:
        """Stop the coordinator and the stages."""
        self.lp.stop()


def ss_sockets() -> list[dict]:
    """Established TCP sockets with their owner pid and kernel byte counters (`ss -tinpH`)."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                          check=True).stdout
    out: list[dict] = []
    cur: dict | None = None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            parts = line.split()
            # Recv-Q Send-Q Local Peer users:((...))
            local, peer = parts[2], parts[3]
            pids = [int(x) for x in re.findall(r"pid=(\d+)", line)]
            cur = {"local": int(local.rsplit(":", 1)[1]), "peer": int(peer.rsplit(":", 1)[1]), "pids": pids}
            out.append(cur)
        elif cur is not None:
            for token in line.split():
                key, _, value = token.partition(":")
                if key in ("bytes_sent", "bytes_received", "data_segs_out", "segs_out") and value.isdigit():
                    cur[key] = int(value)
    return out


def own_cpu_seconds(pids: list[int]) -> float:
    """utime+stime of the given processes (seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
