#!/usr/bin/env python3
"""Benchmark: the 2-stage pipeline on loopback against single-process mlx-lm, side by side.

`make bench` runs this script. It prints a Markdown report and writes it to
docs/benchmark.md (command line, date, machine, BLAS, versions, tables, targets).

What is compared, in ONE run and interleaved round by round (this machine is shared and
noisy, so only ratios measured side by side mean anything):

* single-process mlx-lm: `mlx_lm.generate.generate_step` on the whole model, in a worker
  subprocess whose BLAS (OpenBLAS preloaded by `orchestrator.engine.blas.preload()`, or the
  wheel's reference BLAS with PIPESERVE_BLAS=reference) and thread count are set by its
  environment. It is the reference. It serves one request at a time, so its aggregate
  decode rate at N concurrent requests is its 1-request rate (requests queue).
* the pipeline: `LocalPipeline` (stage processes plus the coordinator process), driven
  through the coordinator's HTTP API (`POST /v1/completions`, token-id prompt,
  temperature 0, streaming with `logprobs: 0` so that every token arrives as its own event).

Per system: decode tokens/s at 1, 2 and 4 concurrent requests (1 / median inter-token
interval, summed over concurrent requests), time to first token for a 512-token prompt,
resident memory per process, and for the pipeline the bytes that cross each boundary per
decode token (from the kernel's per-socket counters, `ss -ti`), plus where the time of one
token goes (per-stage step_ms from GET /health, CPU time per process from /proc) and the
micro-batch step times at 4 requests. Targets are judged on each system's best round;
"other load" says how many cores other users' processes took during each system's
measurements.

Usage: .venv/bin/python e2e/bench_pipeline.py [--quick] [--models smollm2,llama1b]
       [--no-reference-blas] [--repeats N] [--tokens N] [--systems ...] [--variant ...]
       [--max-seconds S] [--out docs/benchmark.md] [--json raw.json]

A/B of an engine change, side by side in one run:
  e2e/bench_pipeline.py --no-reference-blas --systems single2,pipe1 \
      --variant pipeline:1:PYTHONPATH=/path/to/patched/checkout,PIPESERVE_SOLO_THREADS=2
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import importlib.metadata as md
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Before that, books were "
    "copied by hand, which made them rare and expensive. Within fifty years, presses were working in "
    "more than two hundred cities across Europe, and millions of books had been printed. "
)
DECODE_TOPICS = ["a lighthouse keeper", "the first railway", "a small mountain village", "an old clockmaker",
                 "a river in spring", "the invention of paper", "a long winter", "a quiet library"]

# Targets (ratios from the same run); see the brief in docs/benchmark.md.
T_DECODE1 = 0.95   # pipeline decode, 1 request  >= 0.95 x single process (same total cores)
T_AGG4 = 2.0       # pipeline aggregate at 4 requests >= 2.0 x pipeline at 1 request
T_TTFT = 1.15      # pipeline TTFT <= 1.15 x single process
FRAME_SLACK = 64   # bytes per decode token per boundary <= hidden * elemsize + 64
RETURN_MAX = 64    # return path bytes per token <= 64
MIN_TOKENS = 8     # a decode measurement cut short by --max-seconds keeps at least this many tokens


# ----------------------------------------------------------------------------------------
# Worker subprocess: single-process mlx-lm (the reference) and model preparation.
# ----------------------------------------------------------------------------------------

def _openblas_info() -> dict:
    import ctypes

    from orchestrator.engine import blas

    path = blas.find_openblas()
    if path is None or blas.active() != "openblas":
        return {}
    lib = ctypes.CDLL(str(path))
    lib.openblas_get_config.restype = ctypes.c_char_p
    return {"config": lib.openblas_get_config().decode(), "threads": lib.openblas_get_num_threads()}


def _proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / VmHWM in bytes from /proc/PID/status."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def worker_reference(model_dir: Path) -> int:
    """Serve timing commands (JSON lines on stdin) for single-process mlx-lm on one model."""
    from orchestrator.engine import blas

    which = blas.preload()  # before mlx; OPENBLAS_NUM_THREADS comes from the environment
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.generate import generate_step
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_model

    out = os.fdopen(os.dup(1), "w", buffering=1)  # results only; stray prints go to stderr
    os.dup2(2, 1)
    model, _ = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    eos = set(tokenizer.eos_token_ids)
    weight_bytes = sum(v.nbytes for _, v in nn.utils.tree_flatten(model.parameters()))

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")

    reply({"ready": True, "blas": which, "openblas": _openblas_info(), "weight_bytes": weight_bytes,
           "env_threads": os.environ.get("OPENBLAS_NUM_THREADS")})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "decode":
                t0 = time.perf_counter()
                times, ids, lps = [], [], []
                cap = cmd.get("max_seconds") or float("inf")
                cut = False
                for token, logprobs in generate_step(mx.array(cmd["prompt"]), model, max_tokens=cmd["max_tokens"]):
                    times.append(time.perf_counter() - t0)
                    token = int(token)
                    ids.append(token)
                    lps.append(float(logprobs[token].item()))
                    if token in eos:  # the pipeline stops at EOS too
                        break
                    if times[-1] > cap and len(times) >= MIN_TOKENS and len(times) < cmd["max_tokens"]:
                        cut = True
                        break
                mx.synchronize()  # generate_step queues one step ahead: let it finish untimed
                reply({"times": times, "tokens": ids, "logprobs": lps, "cut": cut,
                       "texts": [tokenizer.decode([t]) for t in ids]})
            elif op == "ttft":
                t0 = time.perf_counter()
                for _ in generate_step(mx.array(cmd["prompt"]), model, max_tokens=1):
                    break
                seconds = time.perf_counter() - t0
                mx.synchronize()
                reply({"seconds": seconds})
            elif op == "tokenize":
                reply({"ids": list(tokenizer.encode(cmd["text"]))})
            elif op == "memory":
                reply(_proc_status())
            else:
                reply({"error": f"unknown op {op}"})
        except Exception as exc:  # report, keep serving
            reply({"error": repr(exc)})
    return 0


def _demo_cache_key() -> str:
    """Cache key of the SmolLM2 import, for engines without `demo.cached_demo_model`."""
    from orchestrator.models import demo, files, gguf

    digest = hashlib.sha256(demo.WHEEL_SHA256.encode())
    for module in (demo, files, gguf):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


LLAMA1B = dict(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=5632, vocab=32000)


def worker_prepare(which: str) -> int:
    """Print the directory of a benchmark model, importing or generating it once (cached)."""
    from orchestrator.models.demo import cache_root

    root = cache_root()
    if which == "smollm2":
        from orchestrator.models import demo

        if hasattr(demo, "cached_demo_model"):  # the cache the tests and `make demo` use
            path = demo.cached_demo_model("float32")
        else:
            path = root / f"demo-model-float32-{_demo_cache_key()}"
            if not (path / "config.json").is_file():
                print(f"bench: importing SmolLM2-135M-Instruct into {path}", file=sys.stderr)
                demo.import_demo_model(path, dtype="float32", overwrite=True)
    elif which == "llama1b":
        from orchestrator.models import files, testmodel

        digest = hashlib.sha256(json.dumps(LLAMA1B, sort_keys=True).encode())
        for module in (testmodel, files):
            digest.update(Path(module.__file__).read_bytes())
        path = root / f"bench-llama1b-float32-{digest.hexdigest()[:12]}"
        if not (path / "config.json").is_file():
            print(f"bench: generating the random ~1B model into {path} (3.2 GB, ~30 s)", file=sys.stderr)
            testmodel.make_test_model(path, overwrite=True, **LLAMA1B)
            for stale in root.glob("bench-llama1b-float32-*"):
                if stale != path and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
    else:
        raise SystemExit(f"unknown model {which!r}")
    print(path)
    return 0


# ----------------------------------------------------------------------------------------
# The systems under test, seen from the benchmark process.
# ----------------------------------------------------------------------------------------

class ReferenceWorker:
    """A single-process mlx-lm worker subprocess (model loaded once, driven over pipes)."""

    def __init__(self, model_dir: Path, env: dict[str, str], log: Path) -> None:
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--_worker", "reference",
                                      "--_model", str(model_dir)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env={**os.environ, **env}, text=True, bufsize=1, cwd=ROOT)
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
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        res = self._read()
        if "error" in res:
            raise RuntimeError(f"reference worker: {res['error']}")
        return res

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    t_submit: float
    times: list[float]          # arrival time of each token (perf_counter)
    texts: list[str]
    logprobs: list[float]
    finish: str | None


def stream_completion(port: int, model: str, prompt: list[int], max_tokens: int,
                      deadline: float | None = None) -> Stream:
    """POST /v1/completions with stream=true and logprobs=0 (one SSE event per token).

    With a deadline (perf_counter), the stream is cut (connection closed, which cancels the
    request) once it has passed and MIN_TOKENS tokens have arrived: finish is then "cut"."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "logprobs": 0}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    times, texts, lps, finish = [], [], [], None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        if line.startswith(b"data: [DONE]"):
            break
        t = time.perf_counter()
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        for choice in event.get("choices", []):
            lp = choice.get("logprobs")
            if lp:
                for text, value in zip(lp["tokens"], lp["token_logprobs"]):
                    times.append(t)
                    texts.append(text)
                    lps.append(value)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
        if deadline is not None and finish is None and t > deadline and len(times) >= MIN_TOKENS:
            finish = "cut"
            break
    conn.close()
    return Stream(t0, times, texts, lps, finish)


def run_concurrent(port: int, model: str, prompts: list[list[int]], max_tokens: int,
                   max_seconds: float | None = None) -> list[Stream]:
    """Start len(prompts) streamed requests at once, each from its own thread."""
    results: list[Stream | BaseException | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        try:
            barrier.wait()
            deadline = time.perf_counter() + max_seconds if max_seconds else None
            results[i] = stream_completion(port, model, prompts[i], max_tokens, deadline)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def decode_rate(times: list[float]) -> float:
    """Decode tokens/s of one request: 1 / median inter-token interval.

    The median rather than (tokens-1)/span: on a shared machine another user's burst
    stretches a few intervals; the median measures the engine, and all systems are
    treated alike. The mean-based figure is kept as well (`decode_rate_mean`).
    """
    gaps = [b - a for a, b in zip(times, times[1:])]
    gaps = [g for g in gaps if g > 0] or gaps
    return 1.0 / statistics.median(gaps) if gaps and statistics.median(gaps) > 0 else float("nan")


def decode_rate_mean(times: list[float]) -> float:
    """Tokens per second between the first and the last token of one request."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def aggregate_rate(streams: list[Stream]) -> float:
    """Aggregate decode tokens/s of concurrent requests: the sum of their decode rates.

    Each request gets one token per pass through the pipeline, so its median inter-token
    interval is the cycle it sees; the sum over requests is the steady-state aggregate.
    """
    return sum(decode_rate(s.times) for s in streams)


def aggregate_rate_window(streams: list[Stream]) -> float:
    """Tokens arriving while every request is decoding, per second (mean-based check)."""
    start = max(s.times[0] for s in streams)
    end = min(s.times[-1] for s in streams)
    if end <= start:
        return float("nan")
    return sum(1 for s in streams for t in s.times if start < t <= end) / (end - start)


def ss_sockets() -> list[dict]:
    """Established TCP sockets with their owner pid and kernel byte counters (`ss -tinpH`)."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True,
                          check=True).stdout
    out, cur = [], None
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


class PipelineSystem:
    """A LocalPipeline (stages + coordinator) driven through its HTTP API."""

    def __init__(self, model_dir: Path, workdir: Path, splits: list[tuple[int, int]], threads: int,
                 env: dict[str, str], model_name: str, cluster: dict[str, object] | None = None) -> None:
        from orchestrator.engine.local import LocalPipeline

        self.model_name = model_name
        kwargs: dict[str, Any] = {}
        if "model_name" in LocalPipeline.__dataclass_fields__:
            kwargs["model_name"] = model_name
        else:
            self.model_name = model_dir.resolve().name
        self.lp = LocalPipeline(workdir, model_dir, splits, threads=threads, env=env, cluster=dict(cluster or {}),
                                **kwargs)
        self.lp.start()
        self.port = self.lp.http_port

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.lp.procs.values()]

    def health(self) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/health")
        body = json.loads(conn.getresponse().read())
        conn.close()
        return body

    def stage_ports(self) -> list[int]:
        return self.lp.ports[1:]

    def counters(self) -> dict[str, int]:
        """Kernel byte counters of the stage-0 -> stage-1 link and the stage-1 <-> coordinator link."""
        pid = {name: p.pid for name, p in self.lp.procs.items()}
        p0, p1 = self.stage_ports()[:2]
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
        self.lp.stop()


# ----------------------------------------------------------------------------------------
# The measurement plan.
# ----------------------------------------------------------------------------------------

@dataclass
class System:
    key: str
    kind: str                    # "single" | "pipeline"
    label: str
    threads: int                 # BLAS threads per process
    env: dict[str, str]
    primary: bool = False        # the same-total-cores pair the targets use
    cluster: dict[str, object] = field(default_factory=dict)  # pipeline: extra [cluster] keys
    handle: Any = None
    results: dict[str, list] = field(default_factory=dict)

    def add(self, metric: str, value: Any) -> None:
        self.results.setdefault(metric, []).append(value)


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


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


def parse_variant(spec: str, base: dict[str, str], index: int) -> System:
    """--variant KIND:THREADS[:KEY=VALUE,...]: an extra system. KIND is single or pipeline;
    KEY=VALUE pairs are environment variables of its processes, except cluster.KEY=VALUE
    (a [cluster] key of the pipeline's TOML, e.g. cluster.prefill_step_size=128)."""
    parts = spec.split(":", 2)
    if len(parts) < 2 or parts[0] not in ("single", "pipeline") or not parts[1].isdigit():
        raise SystemExit(f"--variant {spec!r}: expected single|pipeline:THREADS[:KEY=VALUE,...]")
    kind, threads = parts[0], int(parts[1])
    env = {**base, "OPENBLAS_NUM_THREADS": str(threads)}
    cluster: dict[str, object] = {}
    for item in (parts[2].split(",") if len(parts) > 2 and parts[2] else []):
        key, _, value = item.partition("=")
        if key.startswith("cluster."):
            cluster[key[8:]] = int(value) if value.isdigit() else value
        else:
            env[key] = value
    extras = ", ".join(f"{k}={v}" for k, v in {**{k: v for k, v in env.items() if k not in base
                                                  and k != "OPENBLAS_NUM_THREADS"}, **cluster}.items())
    label = (f"pipeline, 2 stages × {threads} BLAS threads" if kind == "pipeline"
             else f"single-process mlx-lm, {threads} BLAS threads") + (f", {extras}" if extras else "")
    return System(f"var{index}", kind, label, threads, env, cluster=cluster)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workroot = Path(args.workdir)
        self.groups: list[dict] = []
        self.log = print

    # --- models and prompts ---------------------------------------------------------------
    def prepare(self, which: str) -> Path:
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_worker", "prepare",
                              "--_model", which], capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            raise RuntimeError(f"preparing {which} failed:\n{res.stderr[-3000:]}")
        return Path(res.stdout.strip().splitlines()[-1])

    def prompts(self, which: str, ref: ReferenceWorker, vocab: int) -> tuple[list[list[int]], list[int]]:
        """Decode prompts (one per concurrent request) and the 512-token TTFT prompt."""
        n = self.args.prompt_tokens
        if which == "smollm2":
            # This form makes SmolLM2 write on (no EOS within 128 tokens for any of these topics).
            decode = [ref.call("tokenize", text=f"Chapter 1. The story of {t}\n\nIt was")["ids"]
                      for t in DECODE_TOPICS]
            long_ids = ref.call("tokenize", text=PROMPT_TEXT * (1 + n // 40))["ids"]
            while len(long_ids) < n:
                long_ids += long_ids
            return decode, long_ids[:n]
        rng = random.Random(1234)
        decode = [[rng.randrange(3, vocab) for _ in range(12)] for _ in DECODE_TOPICS]
        return decode, [rng.randrange(3, vocab) for _ in range(n)]

    # --- one group: one model, one BLAS, several systems side by side ----------------------
    def systems_for(self, model: str, blas: str) -> list[System]:
        base = {"PIPESERVE_BLAS": blas}
        if blas == "reference":
            # netlib's reference BLAS is single-threaded: thread settings change nothing.
            return [System("single", "single", "single-process mlx-lm (reference BLAS, 1 thread)", 1,
                           {**base, "OPENBLAS_NUM_THREADS": "1"}, primary=True),
                    System("pipe1", "pipeline", "pipeline, 2 stages (reference BLAS)", 1,
                           {**base, "OPENBLAS_NUM_THREADS": "1"}, primary=True)]
        catalogue = {
            "single2": System("single2", "single", "single-process mlx-lm, 2 BLAS threads", 2,
                              {**base, "OPENBLAS_NUM_THREADS": "2"}, primary=True),
            "single1": System("single1", "single", "single-process mlx-lm, 1 BLAS thread", 1,
                              {**base, "OPENBLAS_NUM_THREADS": "1"}),
            "pipe1": System("pipe1", "pipeline", "pipeline, 2 stages × 1 BLAS thread", 1,
                            {**base, "OPENBLAS_NUM_THREADS": "1"}, primary=True),
            "pipe2": System("pipe2", "pipeline", "pipeline, 2 stages × 2 BLAS threads", 2,
                            {**base, "OPENBLAS_NUM_THREADS": "2"}),
            # What the demo runs: 1 thread per stage, every core for a step nothing else competes
            # with (the coordinator's SOLO flag).
            "pipesolo": System("pipesolo", "pipeline", "pipeline, 2 stages × 1 BLAS thread, all cores when SOLO", 1,
                               {**base, "OPENBLAS_NUM_THREADS": "1",
                                "PIPESERVE_SOLO_THREADS": str(os.cpu_count() or 1)}, primary=True),
        }
        if self.args.systems:
            wanted = self.args.systems.split(",")
        elif model != "smollm2":
            wanted = ["single2", "pipe1", "pipesolo"]  # the 2-threads-per-stage trap is shown on SmolLM2 already
        else:
            wanted = ["single2", "pipe1", "pipesolo"] if self.args.quick else list(catalogue)
        unknown = [w for w in wanted if w not in catalogue]
        if unknown:
            raise SystemExit(f"unknown --systems {unknown}; choose from {list(catalogue)}")
        out = [catalogue[w] for w in wanted]
        for spec in self.args.variant:
            out.append(parse_variant(spec, base, len(out)))
        if not any(x.kind == "single" and x.primary for x in out):
            raise SystemExit("the run needs the reference system single2")
        return out

    def start(self, s: System, model_dir: Path, splits: list[tuple[int, int]], name: str, tag: str) -> None:
        workdir = self.workroot / tag / s.key
        workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        if s.kind == "single":
            s.handle = ReferenceWorker(model_dir, s.env, workdir / "worker.log")
        else:
            s.handle = PipelineSystem(model_dir, workdir, splits, s.threads, s.env, name, s.cluster)
        self.log(f"  started {s.label} in {time.perf_counter() - t0:.1f} s")

    def run_group(self, model: str, blas: str) -> dict:
        args = self.args
        model_dir = self.prepare(model)
        cfg = json.loads((model_dir / "config.json").read_text())
        splits = self.split(cfg)
        tag = f"{model}-{blas}"
        systems = self.systems_for(model, blas)
        tokens = args.tokens if model == "smollm2" else max(8, args.tokens // 2)
        if blas == "reference" and not args.full:
            tokens = min(tokens, 24)  # ~5 tok/s on this BLAS
        repeats = args.repeats
        if blas == "reference" and not args.full:
            # ~35 s per 512-token prefill on this BLAS: one TTFT round, at most two rounds.
            repeats, ttft_repeats = min(2, repeats), 1
        elif model != "smollm2" and not args.full:
            repeats = ttft_repeats = min(2, repeats)  # ~0.3-0.5 s per token
        else:
            ttft_repeats = repeats
        self.log(f"\n## {model} / {blas} BLAS: split {splits}, {len(systems)} systems, {repeats} rounds, "
                 f"{tokens} tokens per request")
        group = {"model": model, "model_dir": str(model_dir), "blas": blas, "config": cfg, "splits": splits,
                 "tokens": tokens, "systems": systems, "repeats": repeats}
        try:
            for s in systems:
                self.start(s, model_dir, splits, model, tag)
            ref = next(s for s in systems if s.kind == "single")
            decode_prompts, long_prompt = self.prompts(model, ref.handle, int(cfg["vocab_size"]))
            group["prompt_tokens"] = len(long_prompt)
            pids = [p for s in systems for p in s.handle.pids]
            # Warm up every system: allocate KV caches and buffers, fault in the weights.
            for s in systems:
                self.decode1(s, decode_prompts[0], 4, record=False)
                self.ttft(s, long_prompt[: min(64, len(long_prompt))], record=False)
            self.all_pids = pids + [os.getpid()]
            cpu0, own0, wall0 = machine_cpu_seconds(), own_cpu_seconds(self.all_pids), time.monotonic()
            for r in range(repeats):
                order = systems[r % len(systems):] + systems[: r % len(systems)]
                if r % 2:
                    order = order[::-1]
                self.log(f"  round {r + 1}/{repeats}")
                for s in order:
                    self.noisy(s, self.decode1, s, decode_prompts[0], tokens)
                for conc in (2, 4):
                    for s in order:
                        if s.kind == "pipeline":
                            self.noisy(s, self.concurrent, s, decode_prompts[:conc], tokens)
                if r < ttft_repeats:
                    for s in order:
                        self.noisy(s, self.ttft, s, long_prompt)
            busy = machine_cpu_seconds() - cpu0
            own = own_cpu_seconds(self.all_pids) - own0
            wall = time.monotonic() - wall0
            group["noise"] = {"wall_s": wall, "busy_cores": busy / wall, "own_cores": own / wall,
                              "other_cores": max(0.0, busy - own) / wall, "loadavg": os.getloadavg()}
            for s in systems:
                self.profile(s, decode_prompts[1], max(48, tokens))
                if s.kind == "pipeline":
                    self.wire(s, decode_prompts[0], group)
                self.memory(s)
            self.check_tokens(group)
        finally:
            for s in systems:
                if s.handle is not None:
                    s.handle.stop()
        return group

    def split(self, cfg: dict) -> list[tuple[int, int]]:
        from orchestrator.engine import local

        if self.args.split == "balanced" and hasattr(local, "compute_split"):
            return local.compute_split(cfg, 2)
        return local.even_split(int(cfg["num_hidden_layers"]), 2)

    # --- metrics ------------------------------------------------------------------------
    def noisy(self, s: System, fn: Any, *args: Any) -> None:
        """Run one measurement and record how many cores other users' processes took meanwhile."""
        m0, o0, w0 = machine_cpu_seconds(), own_cpu_seconds(self.all_pids), time.monotonic()
        fn(*args)
        wall = time.monotonic() - w0
        other = max(0.0, (machine_cpu_seconds() - m0) - (own_cpu_seconds(self.all_pids) - o0)) / wall
        s.add("other_cores", other)

    def decode1(self, s: System, prompt: list[int], tokens: int, record: bool = True) -> None:
        if s.kind == "single":
            res = s.handle.call("decode", prompt=prompt, max_tokens=tokens, max_seconds=self.args.max_seconds)
            rate, n = decode_rate(res["times"]), len(res["times"])
            sample = {"texts": res["texts"], "logprobs": res["logprobs"], "ttft_short": res["times"][0]}
            if res.get("cut") and record:
                s.add("cut", 1)
        else:
            st = stream_completion(s.handle.port, s.handle.model_name, prompt, tokens,
                                   time.perf_counter() + self.args.max_seconds)
            rate, n = decode_rate(st.times), len(st.times)
            sample = {"texts": st.texts, "logprobs": st.logprobs, "ttft_short": st.times[0] - st.t_submit,
                      "finish": st.finish}
            if st.finish not in ("length", "cut"):
                s.add("early_stop", [st.finish])
            if st.finish == "cut":
                s.add("cut", 1)
        if record:
            s.add("decode1", rate)
            s.add("decode1_mean", decode_rate_mean(res["times"] if s.kind == "single" else st.times))
            s.add("decode1_tokens", n)
            s.results["sample"] = [sample]
            self.log(f"    {s.label:70s} decode x1: {rate:6.2f} tok/s ({n} tokens)")

    def profile(self, s: System, prompt: list[int], tokens: int) -> None:
        """Where one token's time goes at 1 request: CPU time of every process per token
        (from /proc), and for the pipeline each stage's compute time per step (`step_ms`
        from GET /health, an EMA that this long decode has flushed of earlier prefills)."""
        procs = {"single": s.handle.proc.pid} if s.kind == "single" else \
            {name: p.pid for name, p in s.handle.lp.procs.items()}
        cpu0 = {k: own_cpu_seconds([pid]) for k, pid in procs.items()}
        if s.kind == "single":
            times = s.handle.call("decode", prompt=prompt, max_tokens=tokens, max_seconds=self.args.max_seconds)["times"]
        else:
            times = stream_completion(s.handle.port, s.handle.model_name, prompt, tokens,
                                      time.perf_counter() + self.args.max_seconds).times
        cpu = {k: 1000 * (own_cpu_seconds([pid]) - cpu0[k]) / len(times) for k, pid in procs.items()}
        gaps = [b - a for a, b in zip(times, times[1:])]
        prof = {"interval_ms": 1000 * statistics.median(gaps), "mean_interval_ms": 1000 * statistics.fmean(gaps),
                "cpu_ms": cpu, "tokens": len(times)}
        if s.kind == "pipeline":
            time.sleep(0.7)  # the next PONG carries the stage stats of the last steps
            prof["step_ms"] = [float(x.get("step_ms", float("nan"))) for x in s.handle.health().get("stages", [])]
            # step_ms is an EMA (a mean), so compare it with the mean interval
            prof["overhead_ms"] = prof["mean_interval_ms"] - sum(prof["step_ms"])
        s.results["profile"] = prof

    def concurrent(self, s: System, prompts: list[list[int]], tokens: int) -> None:
        streams = run_concurrent(s.handle.port, s.handle.model_name, prompts, tokens, self.args.max_seconds)
        rate = aggregate_rate(streams)
        ends = [st.finish for st in streams]
        s.add(f"agg{len(prompts)}", rate)
        s.add(f"agg{len(prompts)}_window", aggregate_rate_window(streams))
        if any(e not in ("length", "cut") for e in ends):
            s.add("early_stop", ends)
        if "cut" in ends:
            s.add("cut", 1)
        if len(prompts) == 4:
            time.sleep(0.6)  # the next PONG carries step_ms (EMA) and the micro-batch size of the last steps
            s.add("busy_stages", [(x.get("step_ms"), x.get("batch")) for x in s.handle.health().get("stages", [])])
        self.log(f"    {s.label:70s} aggregate x{len(prompts)}: {rate:6.2f} tok/s "
                 f"({sum(len(st.times) for st in streams)} tokens)")

    def ttft(self, s: System, prompt: list[int], record: bool = True) -> None:
        if s.kind == "single":
            seconds = s.handle.call("ttft", prompt=prompt)["seconds"]
        else:
            st = stream_completion(s.handle.port, s.handle.model_name, prompt, 1)
            seconds = st.times[0] - st.t_submit
        if record:
            s.add("ttft", seconds)
            self.log(f"    {s.label:70s} TTFT {len(prompt)} tokens: {seconds:6.3f} s")

    def wire(self, s: System, prompt: list[int], group: dict) -> None:
        """Bytes per decode token per boundary, from the kernel's socket counters.

        Two sequential requests with the same prompt and different lengths: the difference
        of the bytes divided by the difference of the tokens is the marginal cost of one
        decode token (prefill, OPEN and CLOSE cancel out). PONGs on the return path are
        subtracted using the PING count and the PONG size measured while idle.
        """
        h = s.handle
        idle0 = h.counters()
        time.sleep(1.6)
        idle1 = h.counters()
        pings_idle = (idle1["pings"] - idle0["pings"]) / 36
        pong = (idle1["ret_bytes"] - idle0["ret_bytes"]) / pings_idle if pings_idle else 0.0
        n1, n2 = 4, 4 + max(16, group["tokens"] // 2)
        settle = 0.3  # the CLOSE of the request just finished still travels stage 0 -> stage 1
        c0 = h.counters()
        a = stream_completion(h.port, h.model_name, prompt, n1)
        time.sleep(settle)
        c1 = h.counters()
        b = stream_completion(h.port, h.model_name, prompt, n2)
        time.sleep(settle)
        c2 = h.counters()
        dn = len(b.times) - len(a.times)
        d = {k: (c2[k] - c1[k]) - (c1[k] - c0[k]) for k in c0}
        pings = d["pings"] / 36
        fwd = d["fwd_bytes"] / dn
        ret = (d["ret_bytes"] - pings * pong) / dn
        s.results["wire"] = {"fwd_bytes_per_token": fwd, "fwd_segs_per_token": d["fwd_segs"] / dn,
                             "ret_bytes_per_token": ret, "ret_segs_per_token": (d["ret_segs"] - pings) / dn,
                             "pong_bytes": pong, "tokens": dn}

    def memory(self, s: System) -> None:
        if s.kind == "single":
            m = s.handle.call("memory")
            s.results["memory"] = {"processes": {"single": {"rss": m.get("VmRSS"), "hwm": m.get("VmHWM"),
                                                            "weights": s.handle.info["weight_bytes"]}}}
        else:
            stages = {x["id"]: x for x in s.handle.health().get("stages", [])}
            procs = {}
            for name, p in s.handle.lp.procs.items():
                st = _proc_status(p.pid)
                procs[name] = {"rss": st.get("VmRSS"), "hwm": st.get("VmHWM"),
                               "weights": stages.get(name, {}).get("weight_bytes"),
                               "health_rss": stages.get(name, {}).get("rss_bytes")}
            s.results["memory"] = {"processes": procs}

    def check_tokens(self, group: dict) -> None:
        """Greedy output of every system must be the same tokens (same model, same prompt)."""
        base = None
        for s in group["systems"]:
            sample = (s.results.get("sample") or [None])[0]
            if sample is None:
                continue
            if base is None:
                base = sample
                s.results["same_tokens"] = True
                continue
            n = min(len(base["texts"]), len(sample["texts"]))
            s.results["same_tokens"] = base["texts"][:n] == sample["texts"][:n] and n > 0


# ----------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------

def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def mib(x: int | None) -> str:
    return "n/a" if not x else f"{x / 2**20:.0f}"


def best_ratio(a: list[float], b: list[float], lower_is_better: bool = False) -> float:
    """Ratio of the best round of a to the best round of b (noise from other users only ever
    slows a measurement down, so each system's best round is its least disturbed one)."""
    a, b = [x for x in a if x == x], [x for x in b if x == x]
    if not a or not b:
        return float("nan")
    pick = min if lower_is_better else max
    return pick(a) / pick(b)


def paired_ratio(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a[i]/b[i] (both measured in the same round)."""
    return [x / y for x, y in zip(a, b) if y and x == x and y == y]


def spread(xs: list[float], digits: int = 2) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return fmt(xs[0], digits)
    return f"{fmt(median(xs), digits)} ({fmt(min(xs), digits)}–{fmt(max(xs), digits)})"


def machine_info() -> dict:
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass

    def ver(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    return {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu, "mem_gib": mem / 2**30,
            "kernel": platform.release(), "python": platform.python_version(),
            "versions": {p: ver(p) for p in ("mlx", "mlx-cpu", "mlx-lm", "cmeel-openblas", "numpy", "transformers")}}


def report(bench: Bench, groups: list[dict], info: dict, started: dt.datetime, elapsed: float) -> str:
    args = bench.args
    lines = [
        "# Benchmark: 2-stage pipeline vs single-process mlx-lm",
        "",
        f"Generated by `{' '.join(shlex.quote(a) for a in ['.venv/bin/python', 'e2e/bench_pipeline.py', *sys.argv[1:]])}` "
        f"on {started.strftime('%Y-%m-%d %H:%M')} UTC in {elapsed / 60:.1f} min"
        + (" (**--quick**: fewer tokens, rounds and systems)" if args.quick else "") + ".",
        "",
        f"- Machine: {info['nproc']} CPUs ({info['cpu']}), {info['mem_gib']:.0f} GiB RAM, Linux {info['kernel']}, "
        f"Python {info['python']}; shared with other users (see 'other load' per group).",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + ".",
    ]
    blas_cfg = next((s.handle.info.get("openblas", {}).get("config") for g in groups for s in g["systems"]
                     if s.kind == "single" and s.handle and s.handle.info.get("openblas")), None)
    lines.append(f"- BLAS: OpenBLAS from `cmeel-openblas` preloaded by `orchestrator.engine.blas.preload()` "
                 f"({blas_cfg or 'config n/a'}), or the `mlx-cpu` wheel's reference BLAS with "
                 "`PIPESERVE_BLAS=reference`. Each process's BLAS threads are set by `OPENBLAS_NUM_THREADS`.")
    lines += [
        "- Method: every system of a group is started once and measured in turn, round by round "
        "(order rotated each round); numbers are medians over rounds, (min–max) when there are several. "
        "Ratios and target verdicts use each system's best round (another user's load only ever slows a "
        "measurement down, and it does not hit the systems of a round evenly: see 'other load', the cores "
        "other processes used during each system's measurements); the median of the per-round ratios is "
        "shown next to each target.",
        "- Single process = `mlx_lm.generate.generate_step` in a worker process (no HTTP). It serves one request "
        "at a time, so its aggregate decode rate at 2 or 4 concurrent requests equals its 1-request rate: "
        "that is what the pipeline's aggregate is compared with.",
        "- Pipeline = `LocalPipeline` (2 stage processes + coordinator), requests through `POST /v1/completions` "
        "(token-id prompt, temperature 0, `stream: true`, `logprobs: 0` so every token is one event) from client "
        "threads. Decode tok/s of a request = 1 / its median inter-token interval (robust to another user's "
        "burst; all systems alike); aggregate at N requests = the sum over the N requests (each gets one token "
        "per pass through the pipeline). Mean-based figures are in the JSON output. TTFT = request sent → "
        "first token received (single process: call → first token).",
        "- To measure an engine change side by side with this checkout: `--variant "
        "pipeline:1:PYTHONPATH=/path/to/patched/checkout[,ENV=VALUE...]` (children run from a neutral directory "
        "with this checkout on PYTHONPATH unless a variant overrides it).",
        "",
    ]
    for g in groups:
        lines += group_report(g, bench)
    lines += [
        "## Reading the targets",
        "",
        f"- decode ×1 ≥ {T_DECODE1}× the single process with the same total cores (2 BLAS threads, the whole "
        "machine, vs 1 thread per stage);",
        f"- pipeline aggregate at 4 requests ≥ {T_AGG4}× pipeline at 1 request;",
        f"- TTFT (512-token prompt) ≤ {T_TTFT}× the single process;",
        f"- bytes per decode token per boundary ≤ hidden × element size + {FRAME_SLACK}; return path ≤ {RETURN_MAX} "
        "bytes per token. Bytes are TCP payload bytes counted by the kernel (`ss -ti` bytes_sent) on the "
        "stage-0→stage-1 socket and on the stage-1→coordinator socket, as the marginal cost of decode tokens "
        "(two requests of different length, same prompt), PONG bytes removed from the return path.",
        "",
    ]
    return "\n".join(lines) + "\n"


def group_report(g: dict, bench: Bench) -> list[str]:
    systems: list[System] = g["systems"]
    cfg = g["config"]
    hidden = int(cfg["hidden_size"])
    elem = 4 if cfg.get("torch_dtype", "float32") == "float32" else 2
    ref = next(s for s in systems if s.kind == "single" and s.primary)
    n = g["noise"]
    title = "SmolLM2-135M-Instruct (float32)" if g["model"] == "smollm2" else \
        "random Llama ~1B (float32; " + ", ".join(f"{k} {v}" for k, v in LLAMA1B.items()) + ")"
    lines = [
        f"## {title} — {g['blas']} BLAS",
        "",
        f"Split {' / '.join(f'layers {a}-{b}' for a, b in g['splits'])}; {g['tokens']} tokens per request; "
        f"{g['repeats']} rounds; TTFT prompt {g.get('prompt_tokens')} tokens. Other load on the machine during the "
        f"measurements: {n['other_cores']:.2f} of {os.cpu_count()} cores busy with other processes "
        f"(ours: {n['own_cores']:.2f}).",
        "",
        "| system | BLAS threads/process | decode ×1 tok/s | ×1 vs single (best rounds) | aggregate ×2 tok/s | aggregate ×4 tok/s "
        "| ×4 vs own ×1 (best) | TTFT s | TTFT vs single (best) | RSS MiB (per process) | same tokens | other load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in systems:
        r = s.results
        d1 = r.get("decode1", [])
        if s.kind == "single":
            agg2 = agg4 = "= ×1 (one at a time)"
            agg_ratio = "1.00"
        else:
            agg2, agg4 = spread(r.get("agg2", [])), spread(r.get("agg4", []))
            agg_ratio = fmt(best_ratio(r.get("agg4", []), d1))
        ttft = r.get("ttft", [])
        mem = r.get("memory", {}).get("processes", {})
        rss = " + ".join(f"{k.replace('stage-', 's')}: {mib(v['rss'])}" for k, v in mem.items()) \
            if s.kind == "pipeline" else mib(mem.get("single", {}).get("rss"))
        if s.kind == "pipeline":
            rss += f" = {mib(sum(v['rss'] or 0 for v in mem.values()))}"
        lines.append(
            f"| {s.label}{' **(target pair)**' if s.primary else ''} | {s.threads} | {spread(d1)} | "
            f"{fmt(best_ratio(d1, ref.results.get('decode1', [])))} | {agg2} | {agg4} | {agg_ratio} | "
            f"{spread(ttft, 3)} | {fmt(best_ratio(ttft, ref.results.get('ttft', []), True))} | {rss} | "
            f"{'yes' if r.get('same_tokens') else 'NO'} | {fmt(median(r.get('other_cores', [])))} |")
    lines.append("")
    # memory detail
    lines += ["Memory (MiB): resident now / peak / weights held.", ""]
    lines += ["| system | process | RSS | peak RSS | weights |", "|---|---|---|---|---|"]
    for s in systems:
        for name, v in s.results.get("memory", {}).get("processes", {}).items():
            lines.append(f"| {s.label} | {name} | {mib(v['rss'])} | {mib(v['hwm'])} | {mib(v.get('weights'))} |")
    lines.append("")
    single_rss = ref.results.get("memory", {}).get("processes", {}).get("single", {}).get("rss")
    for s in systems:
        procs = s.results.get("memory", {}).get("processes", {})
        stages = [v["rss"] for k, v in procs.items() if k.startswith("stage-") and v.get("rss")]
        if s.kind == "pipeline" and stages and single_rss:
            total = sum(v["rss"] or 0 for v in procs.values())
            lines.append(f"- {s.label}: largest stage {100 * max(stages) / single_rss:.0f}% of the single process's "
                         f"RSS; all pipeline processes together {100 * total / single_rss:.0f}%.")
    lines.append("")
    # profile
    pipes = [s for s in systems if s.kind == "pipeline"]
    lines += ["Where one token's time goes at 1 request (a separate 48-token decode per system: median and mean "
              "token interval; pipeline stage compute = `step_ms` from GET /health, an EMA of the last steps; "
              "overhead = mean interval − sum of stage compute = transport, coordinator, HTTP and Python between "
              "steps; CPU ms per token of each process from /proc, all its threads — more CPU than wall time "
              "means BLAS threads spinning):", "",
              "| system | token interval ms: median / mean | stage compute ms | overhead ms/token | "
              "CPU ms/token per process |",
              "|---|---|---|---|---|"]
    for s in systems:
        prof = s.results.get("profile")
        if not prof:
            continue
        cpu = ", ".join(f"{k}: {fmt(v, 1)}" for k, v in prof["cpu_ms"].items())
        steps = " + ".join(fmt(x, 1) for x in prof.get("step_ms", [])) or "–"
        lines.append(f"| {s.label} | {fmt(prof['interval_ms'], 1)} / {fmt(prof.get('mean_interval_ms'), 1)} | {steps} | "
                     f"{fmt(prof.get('overhead_ms'), 1) if 'overhead_ms' in prof else '–'} | {cpu} |")
    lines.append("")
    busy = [s for s in pipes if s.results.get("busy_stages")]
    if busy:
        lines += ["At 4 concurrent requests (last round): each stage's compute per step and its micro-batch size "
                  "(the scheduler keeps one group per stage in flight, so 4 requests run as 2 groups of 2; one "
                  "full cycle of all requests costs about 2 × the slower stage's step):", "",
                  "| system | stage step ms (micro-batch) | predicted ×4 tok/s = 4 / (2 × slowest step) | measured ×4 |",
                  "|---|---|---|---|"]
        for s in busy:
            last = s.results["busy_stages"][-1]
            slow = max((x[0] or 0) for x in last)
            pred = 4000 / (2 * slow) if slow else float("nan")
            lines.append(f"| {s.label} | {' + '.join(f'{fmt(ms, 1)} (×{b})' for ms, b in last)} | {fmt(pred, 1)} | "
                         f"{fmt(s.results.get('agg4', [float('nan')])[-1], 1)} |")
        lines.append("")
    # wire
    lines += [f"Wire bytes per decode token (hidden {hidden} × {elem} bytes = {hidden * elem}; frame header 36):", "",
              "| system | stage-0→stage-1 bytes/token | segments/token | stage-1→coordinator bytes/token | "
              "segments/token |", "|---|---|---|---|---|"]
    for s in pipes:
        w = s.results.get("wire", {})
        lines.append(f"| {s.label} | {fmt(w.get('fwd_bytes_per_token'), 1)} | {fmt(w.get('fwd_segs_per_token'))} | "
                     f"{fmt(w.get('ret_bytes_per_token'), 1)} | {fmt(w.get('ret_segs_per_token'))} |")
    lines.append("")
    # targets
    lines += [f"Targets (each pipeline configuration against the reference: {ref.label}):", "",
              "| pipeline | target | measured (best rounds) | per-round ratio, median | result |",
              "|---|---|---|---|---|"]
    g["targets"] = []
    for s in pipes:
        r = s.results
        d1 = r.get("decode1", [])
        rd1 = ref.results.get("decode1", [])
        checks = [
            (f"decode ×1 ≥ {T_DECODE1}× single", best_ratio(d1, rd1), median(paired_ratio(d1, rd1)),
             lambda v: v >= T_DECODE1, 2),
            (f"aggregate ×4 ≥ {T_AGG4}× own ×1", best_ratio(r.get("agg4", []), d1),
             median(paired_ratio(r.get("agg4", []), d1)), lambda v: v >= T_AGG4, 2),
            (f"TTFT ≤ {T_TTFT}× single", best_ratio(r.get("ttft", []), ref.results.get("ttft", []), True),
             median(paired_ratio(r.get("ttft", []), ref.results.get("ttft", []))), lambda v: v <= T_TTFT, 2),
            (f"bytes/token/boundary ≤ {hidden * elem + FRAME_SLACK}", r.get("wire", {}).get("fwd_bytes_per_token"),
             None, lambda v: v <= hidden * elem + FRAME_SLACK, 1),
            (f"return path ≤ {RETURN_MAX} bytes/token", r.get("wire", {}).get("ret_bytes_per_token"), None,
             lambda v: v <= RETURN_MAX, 1),
        ]
        for name, value, paired, ok, digits in checks:
            verdict = "n/a" if value is None or value != value else ("PASS" if ok(value) else "MISS")
            g["targets"].append((s.label, name, value, verdict))
            lines.append(f"| {s.label} | {name} | {fmt(value, digits)} | "
                         f"{fmt(paired, digits) if paired is not None else '–'} | {verdict} |")
        singles = [x for x in systems if x.kind == "single"]
        if len(singles) > 1:
            best = [max(vals) for vals in zip(*[x.results.get("decode1", []) for x in singles])]
            lines.append(f"| {s.label} | (info) decode ×1 vs the faster single-process configuration of each round | "
                         f"{fmt(max(d1) / max(best) if d1 and best else float('nan'))} | "
                         f"{fmt(median(paired_ratio(d1, best)))} | – |")
    lines.append("")
    cuts = [s.label for s in systems if s.results.get("cut")]
    if cuts:
        lines += [f"Note: decode measurements of {', '.join(cuts)} were cut at --max-seconds "
                  f"({bench.args.max_seconds:g} s; rates use the tokens received).", ""]
    stops = [(s.label, s.results["early_stop"]) for s in systems if s.results.get("early_stop")]
    if stops:
        lines += [f"Note: some requests ended before max_tokens: {stops}", ""]
    return lines


# ----------------------------------------------------------------------------------------

def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short run for development: 1 round, 24 tokens, "
                   "fewer systems, no reference-BLAS group")
    p.add_argument("--models", default="smollm2", help="comma list of smollm2, llama1b (default smollm2; "
                   "llama1b, a random ~1B float32 model generated once into the cache, adds ~6 min and ~8 GB)")
    p.add_argument("--no-reference-blas", action="store_true", help="skip the PIPESERVE_BLAS=reference group")
    p.add_argument("--repeats", type=int, default=None, help="rounds per group (default 3, quick 1)")
    p.add_argument("--tokens", type=int, default=None, help="decode tokens per request (default 32, quick 24)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="TTFT prompt length (default 512)")
    p.add_argument("--max-seconds", type=float, default=12.0, help="cut a decode measurement after this long "
                   "(keeping at least 8 tokens), so a slow configuration cannot stretch the run (default 12)")
    p.add_argument("--split", choices=["balanced", "even"], default="balanced",
                   help="layer split: balanced by compute incl. the head (local.compute_split), or even")
    p.add_argument("--systems", default=None, help="comma list from single2,single1,pipe1,pipe2,pipesolo "
                   "(default: all for SmolLM2; single2,pipe1,pipesolo with --quick or other models)")
    p.add_argument("--variant", action="append", default=[], metavar="KIND:THREADS[:K=V,...]",
                   help="add a system, e.g. pipeline:2:OPENBLAS_THREAD_TIMEOUT=20, "
                   "pipeline:1:cluster.prefill_step_size=128, or pipeline:1:PYTHONPATH=/other/checkout to "
                   "measure another engine tree side by side (repeatable)")
    p.add_argument("--full", action="store_true", help="no shortcuts: every round of TTFT with the reference "
                   "BLAS, all rounds for llama1b, llama1b with the reference BLAS too (very slow)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmark.md"), help="Markdown report path")
    p.add_argument("--json", default=None, help="also write raw results as JSON here")
    p.add_argument("--workdir", default="/tmp/pipeserve-bench", help="logs of the processes")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    p.add_argument("--_model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker == "reference":
        return worker_reference(Path(args._model))
    if args._worker == "prepare":
        return worker_prepare(args._model)
    args.out = str(Path(args.out).resolve())
    args.json = str(Path(args.json).resolve()) if args.json else None
    args.workdir = str(Path(args.workdir).resolve())
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.tokens = args.tokens or (24 if args.quick else 32)
    signal.signal(signal.SIGTERM, _interrupt)  # stop every started process on the way out
    if shutil.which("ss") is None:
        print("bench: `ss` (iproute2) is needed for the wire-byte measurement", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()
    # Children run `python -m orchestrator.cli` from a neutral directory with this checkout on
    # PYTHONPATH, so that a --variant can set PYTHONPATH to another engine tree (A/B of a patch).
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    os.chdir(args.workdir)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    bench = Bench(args)
    info = machine_info()
    print(f"bench: {info['nproc']} CPUs ({info['cpu']}); load average {os.getloadavg()}")
    groups = []
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    blases = ["openblas"] + ([] if (args.no_reference_blas or args.quick) else ["reference"])
    for model in models:
        for blas in blases:
            if blas == "reference" and model != "smollm2" and not args.full:
                print(f"bench: skipping {model} with the reference BLAS (minutes per prompt; --full runs it)")
                continue
            groups.append(bench.run_group(model, blas))
    text = report(bench, groups, info, started, time.monotonic() - t0)
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"bench: wrote {out}")
    if args.json:
        raw = [{**{k: v for k, v in g.items() if k != "systems"},
                "systems": [{"key": s.key, "label": s.label, "threads": s.threads, "env": s.env,
                             "results": s.results} for s in g["systems"]]} for g in groups]
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
