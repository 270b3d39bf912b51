"""Benchmark over the emulated links: `sudo .venv/bin/python -m e2e.lan.bench_lan [--profiles ...] [--long]`.

Per link profile (e2e/lan/profiles.py) SmolLM2-135M (float32) runs split 0-14 / 15-29 with
stage 0 and the coordinator on node-a, stage 1 on node-b (each in its own namespace), and
the client in the control namespace measures: decode tok/s at 1 request, aggregate at 4, 8
and 16, and time to first token of a 1k-token prompt (8k with --long). Beside each number,
the planner's prediction (planner/predict.py) from the layers timed on this machine
(engine/profile.py) just before that profile's measurements (on a shared machine the load
drifts: a timing taken minutes earlier predicts another machine) and the link measured
between the two namespaces. Prints a Markdown table
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

from orchestrator.agent.local import SHARED_HOST_BLAS
from orchestrator.agent.report import machine_id
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.predict import StageSpec, predict

from .netns import REPO, Lan, LanHost, joined, unavailable
from .profiles import PROFILES

SPLIT = ((0, 14), (15, 29))
# The "8k" prompt: SmolLM2's 8192-token context must hold the prompt and the generated token.
LONG = 8191
PORT = 8100
PROBE = """import socket,time,statistics,json,sys
c=socket.create_connection((sys.argv[1],5001));c.setsockopt(6,1,1)
ts=[]
for i in range(40):
  t=time.perf_counter();c.sendall(b'x');c.recv(10);ts.append(time.perf_counter()-t)
buf=bytes(8<<20);t=time.perf_counter();c.sendall(buf);c.recv(10);dt=time.perf_counter()-t
print(json.dumps({"rtt_ms":statistics.median(ts[5:])*1e3,"Bps":(8<<20)/max(dt-statistics.median(ts),1e-6)}))"""
SINK = """import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],5001));s.listen();c,_=s.accept();c.setsockopt(6,1,1)
n=0
while (d:=c.recv(1<<20)):
  n+=len(d)
  if n<=40 or n==40+(8<<20): c.sendall(b'k')"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **SHARED_HOST_BLAS, "PYTHONPATH": str(REPO)}


def measure_link(a: LanHost, b: LanHost) -> LinkCost:
    """Round trip (median of small messages) and throughput (8 MiB) from a to b, raw TCP."""
    sink = subprocess.Popen(b.argv(sys.executable, "-c", SINK, b.ip))
    time.sleep(0.5)
    try:
        out = subprocess.run(a.argv(sys.executable, "-c", PROBE, b.ip), capture_output=True, text=True, timeout=120)
        data = json.loads(out.stdout)
    finally:
        sink.kill()
    return LinkCost(rtt_ms=data["rtt_ms"], bandwidth_Bps=data["Bps"])


def timing(model: Path) -> LayerTiming:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        subprocess.run([sys.executable, "-m", "orchestrator.engine.profile", "--model", str(model), "--out", str(out)],
                       check=True, env=env(), cwd=REPO)
        data = json.loads(out.read_text())
    return LayerTiming(**{k: v for k, v in data.items() if k not in ("threads", "at")})


def cluster_toml(a: LanHost, b: LanHost) -> str:
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
layers = "{SPLIT[0][0]}-{SPLIT[0][1]}"

[[nodes]]
id = "stage-1"
address = "{b.ip}:39602"
role = "pipeline_stage"
stage = 1
layers = "{SPLIT[1][0]}-{SPLIT[1][1]}"
"""


def stream(host: str, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
    """(submit time, token arrival times) of one streamed completion."""
    conn = http.client.HTTPConnection(host, PORT, timeout=900)
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "logprobs": 0, "ignore_eos": True}).encode()
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
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    return 1 / statistics.median(gaps) if gaps else float("nan")


def concurrent(host: str, n: int, tokens: int) -> float:
    out: list[float] = [0.0] * n

    def one(i: int) -> None:
        out[i] = rate(stream(host, [100 + i, 200 + i, 300 + i, 400 + i], tokens)[1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out)


def run_profile(name: str, model: Path, long: bool, root: Path) -> dict:
    load = os.getloadavg()[0]
    t = timing(model)
    print(f"{name}: load {load:.1f}; layers timed: {t.layer_ms_b1_solo:.2f} ms/layer alone, {t.layer_ms_b1:.2f} "
          f"with 1 thread, {t.layer_ms_bB:.2f} for {t.batch} rows, head {t.head_ms_b1_solo:.1f} ms, prefill "
          f"{t.prefill_ms_per_token:.3f} ms/token/layer + {t.prefill_ms_per_token_per_k:.3f} per 1k cached; "
          f"per-step paths (1 / {t.batch} rows): stage {t.step_ms_b1:.2f} / {t.step_ms_bB:.2f} ms, last stage "
          f"{t.last_step_ms_b1:.2f} / {t.last_step_ms_bB:.2f}, coordinator {t.coordinator_ms_b1:.2f} / "
          f"{t.coordinator_ms_bB:.2f}", flush=True)
    with Lan(PROFILES[name], 2) as lan:
        a, b = lan.nodes
        link = measure_link(a, b)
        cfg = root / f"{name}.toml"
        cfg.write_text(cluster_toml(a, b))
        e = {**env(), "PIPESERVE_CLUSTER_SECRET": secrets.token_hex(16)}
        procs = [subprocess.Popen(h.argv(sys.executable, "-m", "orchestrator.cli", *argv), env=e, cwd=REPO,
                                  stdout=open(root / f"{name}-{i}.log", "wb"), stderr=subprocess.STDOUT)
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
                res = {"profile": name, "link": link, "load": load}
                res["decode1"] = rate(stream(a.ip, [1, 2, 3, 4, 5, 6, 7, 8], 24)[1])
                for n in (4, 8, 16):
                    res[f"agg{n}"] = concurrent(a.ip, n, 12)
                for p in (1024, LONG) if long else (1024,):
                    t0, times = stream(a.ip, [(7 * i) % 4000 + 10 for i in range(p)], 1)
                    res[f"ttft{p}"] = times[0] - t0
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
    # every emulated node runs on this machine's cores (their agents report one machine_id)
    stages = [StageSpec(label=f"stage {k}", node_name=n, layer_weight=hi - lo + 1, last=k == 1, timing=t,
                        machine=machine_id())
              for k, ((lo, hi), n) in enumerate(zip(SPLIT, ("node-a", "node-b")))]
    res["pred"] = predict(stages, [link, link], 576 * 4, requests=(4, 8, 16), prompts=(1024, LONG))
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
    args = parser.parse_args(argv)
    # `timeout` and Ctrl-C alike: unwind, so every Lan context deletes its namespaces
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = unavailable()
    if why:
        print(f"bench_lan: {why}", file=sys.stderr)
        return 2
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
