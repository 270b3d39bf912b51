"""Benchmark over the emulated links: `sudo .venv/bin/python -m e2e.lan.bench_lan [--profiles ...] [--long]`
(or `--random N --seed S`: random models and links, e2e/lan/bench_random.py).

Per link profile (e2e/lan/profiles.py) SmolLM2-135M (float32) runs split 0-14 / 15-29 with
stage 0 and the coordinator on node-a, stage 1 on node-b (each in its own namespace), and
the client in the control namespace measures: decode tok/s at 1 request, aggregate at 4, 8
and 16, and time to first token of a 1k-token prompt (8k with --long). Beside each number,
the planner's prediction (planner/predict.py) from the layers timed on this machine
(engine/profiling/layers.py) just before that profile's measurements (on a shared machine the load
drifts: a timing taken minutes earlier predicts another machine) and the link measured
between the two namespaces as the agents measure it (agent/linkecho.py). Prints a Markdown table
and the target ratios. Needs root.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from e2e.bench.layer_timing import time_layers
from e2e.lan.netns import REPO, Lan, LanHost, joined, unavailable
from e2e.lan.profiles import PROFILES, LinkProfile
from orchestrator.agent.local_agent import SHARED_HOST_BLAS
from orchestrator.agent.report import machine_id
from orchestrator.planner.perf_inputs import LinkCost
from orchestrator.planner.predict import StageSpec, predict

SPLIT = ((0, 14), (15, 29))
# The "8k" prompt: SmolLM2's 8192-token context must hold the prompt and the generated token.
LONG = 8191
PORT = 8100
ECHO_PORT = 39650
ECHO = """import sys,time
from orchestrator.agent.linkecho import open_echo
port,nonce=open_echo(sys.argv[1],(int(sys.argv[2]),int(sys.argv[2])),1<<20)
print(port,nonce,flush=True);time.sleep(60)"""
TIME = """import sys,json
from orchestrator.agent.linkecho import time_path
rtt,bw,floor,kernel,_=time_path((sys.argv[1],int(sys.argv[2])),sys.argv[3],16,1<<20)
print(json.dumps({"rtt_ms":rtt,"Bps":bw}))"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, "PYTHONPATH": str(REPO)}


def measure_link(a: LanHost, b: LanHost) -> LinkCost:
    """The link from a to b as the agents measure it (agent/linkecho.py): framed round trips
    and two payload sizes through an echo at b's stage address, relays included."""
    echo = subprocess.Popen(b.argv(sys.executable, "-c", ECHO, b.ip, str(ECHO_PORT)), stdout=subprocess.PIPE,
                            text=True, env=env(), cwd=REPO)
    try:
        port, nonce = echo.stdout.readline().split()  # type: ignore[union-attr]
        out = subprocess.run(a.argv(sys.executable, "-c", TIME, b.ip, port, nonce), capture_output=True, text=True,
                             timeout=120, env=env(), cwd=REPO)
        data = json.loads(out.stdout)
    finally:
        echo.kill()
        echo.wait()
    return LinkCost(rtt_ms=data["rtt_ms"], bandwidth_Bps=data["Bps"])


def cluster_toml(a: LanHost, b: LanHost, split: tuple[tuple[int, int], ...] = SPLIT) -> str:
    return f"""[cluster]
name = "bench-lan"
pipeline_parallel_size = 2
tensor_parallel_size = 1
transport_backend = "tcp"
stall_timeout_s = 300  # a shared, loaded 2-core machine stretches long prefill steps

[[nodes]]
id = "coordinator"
address = "{a.ip}:39600"
role = "hybrid"

[[nodes]]
id = "stage-0"
address = "{a.ip}:39601"
role = "pipeline_stage"
stage = 0
layers = "{split[0][0]}-{split[0][1]}"

[[nodes]]
id = "stage-1"
address = "{b.ip}:39602"
role = "pipeline_stage"
stage = 1
layers = "{split[1][0]}-{split[1][1]}"
"""


def stream(host: str, prompt: list[int], max_tokens: int, extra: dict | None = None) -> tuple[float, list[float]]:
    """(submit time, token arrival times) of one streamed completion (`extra`: more request fields)."""
    conn = http.client.HTTPConnection(host, PORT, timeout=900)
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "logprobs": 0, "ignore_eos": True, **(extra or {})}).encode()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times = []
    while (line := r.readline()) and not line.startswith(b"data: [DONE]"):
        if line.startswith(b"data: "):
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                if ch.get("logprobs"):
                    times += [time.perf_counter()] * len(ch["logprobs"]["tokens"])
    conn.close()
    return t0, times


def rate(times: list[float]) -> float:
    """Decode tok/s of one stream: the median gap between token arrivals; nan without two."""
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return 1 / statistics.median(gaps) if gaps else float("nan")


def concurrent(host: str, n: int, tokens: int, extra: dict | None = None) -> float:
    out: list[float] = [0.0] * n

    def one(i: int) -> None:
        try:
            times = stream(host, [100 + i, 200 + i, 300 + i, 400 + i], tokens, extra)[1]
        except (OSError, RuntimeError, ValueError) as exc:  # said, and the aggregate is nan: not a silent 0
            print(f"request {i} of {n}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            times = []
        out[i] = rate(times)
        if not out[i] == out[i]:
            print(f"request {i} of {n}: {len(times)} tokens, no gap between arrivals to time", file=sys.stderr,
                  flush=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out)


def run_profile(name: str, model: Path, long: bool, root: Path, *, profile: LinkProfile | None = None,
                split: tuple[tuple[int, int], ...] = SPLIT, hidden_bytes: int = 576 * 4,
                requests: tuple[int, ...] = (4, 8, 16), vocab: int = 49152, extra: dict | None = None) -> dict:
    """Time the layers, then on a LAN of `profile` (default PROFILES[name]) serve `model` split
    at `split` and measure decode, aggregates at `requests` and TTFT; with the prediction.
    `extra` goes into every request (a random model's end-of-text bias: the coordinator has no
    ignore_eos, and a random model may end at once)."""
    load = os.getloadavg()[0]
    t, doubt = time_layers(model, env())
    print(f"{name}: load {load:.1f}; layers timed: {t.layer_ms_b1_solo:.2f} ms/layer alone, {t.layer_ms_b1:.2f} "
          f"with 1 thread, {t.layer_ms_bB:.2f} for {t.batch} rows, head {t.head_ms_b1_solo:.1f} ms, prefill "
          f"{t.prefill_ms_per_token:.3f} ms/token/layer + {t.prefill_ms_per_token_per_k:.3f} per 1k cached; "
          f"per-step paths (1 / {t.batch} rows): stage {t.step_ms_b1:.2f} / {t.step_ms_bB:.2f} ms, last stage "
          f"{t.last_step_ms_b1:.2f} / {t.last_step_ms_bB:.2f}, coordinator {t.coordinator_ms_b1:.2f} / "
          f"{t.coordinator_ms_bB:.2f}{'; timed on a busy machine: ' + doubt if doubt else ''}", flush=True)
    with Lan(profile or PROFILES[name], 2) as lan:
        a, b = lan.nodes
        link = measure_link(a, b)
        tag = "".join(c if c.isalnum() else "_" for c in name)  # a drawn profile's name has spaces and '/'
        cfg = root / f"{tag}.toml"
        cfg.write_text(cluster_toml(a, b, split))
        e = {**env(), "PIPESERVE_CLUSTER_SECRET": secrets.token_hex(16)}
        procs = [subprocess.Popen(h.argv(sys.executable, "-m", "orchestrator.cli", *argv), env=e, cwd=REPO,
                                  stdout=open(root / f"{tag}-{i}.log", "wb"), stderr=subprocess.STDOUT)
                 for i, (h, argv) in enumerate([
                     (a, ["stage", "--config", str(cfg), "--node-id", "stage-0", "--model", str(model)]),
                     (b, ["stage", "--config", str(cfg), "--node-id", "stage-1", "--model", str(model)]),
                     (a, ["coordinator", "--config", str(cfg), "--node-id", "coordinator", "--model", str(model),
                          "--host", a.ip, "--port", str(PORT), "--model-name", "m"])])]
        try:
            with joined(lan.control):
                deadline = time.monotonic() + 240
                while True:
                    try:
                        c = http.client.HTTPConnection(a.ip, PORT, timeout=5)
                        c.request("GET", "/health")
                        if c.getresponse().status == 200:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name}: coordinator not ready")
                    time.sleep(0.5)
                res = {"profile": name, "link": link, "load": load, "doubt": doubt}
                res["decode1"] = rate(stream(a.ip, [1, 2, 3, 4, 5, 6, 7, 8], 24, extra)[1])
                for n in requests:
                    res[f"agg{n}"] = concurrent(a.ip, n, 12, extra)
                for p in (1024, LONG) if long else (1024,):
                    t0, times = stream(a.ip, [(7 * i) % (min(vocab, 4010) - 10) + 10 for i in range(p)], 1, extra)
                    res[f"ttft{p}"] = times[0] - t0
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
    # every emulated node runs on this machine's cores (their agents report one machine_id)
    stages = [StageSpec(label=f"stage {k}", node_name=n, layer_weight=hi - lo + 1, last=k == 1, timing=t,
                        machine=machine_id())
              for k, ((lo, hi), n) in enumerate(zip(split, ("node-a", "node-b")))]
    res["pred"] = predict(stages, [link, link], hidden_bytes, requests=requests, prompts=(1024, LONG))
    return res


def table(rows: list[dict]) -> str:
    def pair(meas: float | None, pred: float) -> str:
        if meas is None:
            return f"– / {pred:.2f}"
        return f"{meas:.2f} / {pred:.2f} ({100 * (pred - meas) / meas:+.0f} %)"
    out = ["| profile | link measured (RTT, throughput) | decode ×1 tok/s | aggregate ×4 | ×8 | ×16 | TTFT 1k s | "
           "TTFT 8k s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["pred"]
        link = f"{r['link'].rtt_ms:.2f} ms, {r['link'].bandwidth_Bps * 8 / 1e9:.2f} Gbit/s"
        out.append(f"| {r['profile']} (load {r['load']:.1f}) | {link} | "
                   f"{pair(r['decode1'], p.decode_tps_1)} | {pair(r['agg4'], p.aggregate(4))} | "
                   f"{pair(r['agg8'], p.aggregate(8))} | {pair(r['agg16'], p.aggregate(16))} | "
                   f"{pair(r['ttft1024'], p.ttft(1024))} | {pair(r.get(f'ttft{LONG}'), p.ttft(LONG))} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="loopback,1gbe,wifi,10gbe,thunderbolt")
    parser.add_argument("--long", action="store_true", help="also TTFT of an 8k-token prompt (minutes per profile)")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="instead: N random (model shape, link profile) pairs (e2e/lan/bench_random.py)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of --random's draws")
    args = parser.parse_args(argv)
    # `timeout` and Ctrl-C alike: unwind, so every Lan context deletes its namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = unavailable()
    if why:
        print(f"bench_lan: {why}", file=sys.stderr)
        return 2
    if args.random:
        from e2e.lan.bench_random import run_random

        return run_random(args.random, args.seed)
    from orchestrator.models.demo import cached_demo_model

    model = cached_demo_model("float32")
    load = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.profiles.split(","):
            rows.append(run_profile(name, model, args.long, Path(tmp)))
            print(table(rows[-1:]).splitlines()[-1], flush=True)  # each row as soon as it is measured
    print(f"\nmeasured / predicted (prediction error); load average before {load[0]:.1f}, after "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print(table(rows))
    by = {r["profile"]: r for r in rows}
    if "loopback" in by and "1gbe" in by:
        lo, g = by["loopback"], by["1gbe"]
        print(f"\ndecode ×1 on 1gbe / loopback: {g['decode1'] / lo['decode1']:.2f} (target ≥ 0.90)")
        print(f"aggregate ×16 / ×1 on 1gbe: {g['agg16'] / g['decode1']:.2f} (target ≥ 3)")
        if f"ttft{LONG}" in g:
            print(f"TTFT 8k on 1gbe / loopback: {g[f'ttft{LONG}'] / lo[f'ttft{LONG}']:.2f} (target ≤ 1.25)")
        print(f"TTFT 1k on 1gbe / loopback: {g['ttft1024'] / lo['ttft1024']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
