"""End to end on a split pipeline: tok/s with speculation ÷ without ÷ single-process mlx-lm.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.speculation [--model smollm2] [--tokens 96] [--rounds 2]
       [--draft 4] [--blas openblas] [--stages 2] [--profile 1gbe] [--draft-model LAYERS]

Drafts come from prompt lookup, or with --draft-model from an early-exit draft of the model (its first
LAYERS layers and its head, `pipeserve make-draft-model`) that the speculating coordinator runs.

The stages split the layers as the main benchmark does, balancing per-token compute with the head
counted on the last stage (`local_pipeline.compute_split`: SmolLM2's 2 stages take 19 and 11 layers).
Without --profile every process is on loopback; with it (root only) stage k runs in node k's namespace
of an emulated LAN (e2e/lan/netns.py) with the coordinator beside stage 0, so every boundary and the
return path cross the profile's link.

Three systems of the same model run at once: two pipelines as the demo runs them (1 BLAS thread per stage,
every core for a SOLO step; `speculative_tokens = --draft` and `= 0`) and single-process mlx-lm
(`generate_step` in a worker, every core's BLAS threads). Each workload is measured on all three in turn,
round by round (order rotated every round), at 1 request and at 4 concurrent. A pipeline request is a non-
streamed `POST /v1/chat/completions` at temperature 0; its rate is completion tokens ÷ wall time from sending
to the answer, each system's best round (load only ever slows one down). The prompt cache is off, so every
request pays its prefill (the same prompt is sent round after round). The single process answers the same chat
(template, prefill, decode, detokenize, timed whole in the worker) one request at a time, so its aggregate at
4 is its rate at 1. At 4 a pipeline's aggregate is all tokens ÷ the wall time of the four. Answers must be the
same text in all three (greedy is exact). Acceptance is read from the speculating coordinator's /metrics.
Prints Markdown tables (the ones in docs/benchmark.md): the per-workload table and the per-token targets of
the plain pipeline.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

from e2e.bench.lan_pipeline import LanPipelineSystem
from e2e.bench.procs import PipelineSystem, ReferenceWorker, prepare_model
from e2e.lan.netns import Lan, joined
from e2e.lan.profiles import PROFILES
from orchestrator.engine.local_pipeline import compute_split

CODE = '''def total_price(items, tax):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    discount = 0
    if subtotal > 100:
        discount = subtotal * 0.05
    taxed = (subtotal - discount) * (1 + tax)
    return round(taxed, 2)
'''
TOOL_ARGS = json.dumps({"city": "Lisbon", "check_in": "2026-03-14", "check_out": "2026-03-18", "guests": 2,
                        "rooms": 1, "max_price_eur": 180, "amenities": ["wifi", "breakfast", "parking"]})
CORES = os.cpu_count() or 1
WORKLOADS = {
    "free chat": "Tell me a story about a lighthouse keeper who finds a message in a bottle.",
    "code edit": f"Rewrite this code with one change: rename the variable `subtotal` to `net`. "
                 f"Reply with the whole code only.\n\n```python\n{CODE}```",
    "tool-call echo": f"Call the function book_hotel with exactly these JSON arguments and nothing else: "
                      f"{TOOL_ARGS}\nReply with the JSON arguments only.",
}


class Row(NamedTuple):
    """One workload at one concurrency: each system's median rate and the speculating pipeline's figures."""

    workload: str
    requests: int
    rate: dict[str, float]  # system -> tok/s (its best round)
    acceptance: float
    tokens_per_pass: float
    same_text: bool
    steps: dict[str, list[float]]  # pipeline -> each stage's step ms at the end
    drafts_per_pass: float
    rounds: dict[str, list[float]]  # system -> tok/s of each round (the systems of one round side by side)


def chat(host: str, port: int, prompt: str, max_tokens: int) -> tuple[str, int, float]:
    """One non-streamed greedy chat completion: (text, completion tokens, seconds)."""
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=900)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
    finally:
        conn.close()
    seconds = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data}")
    return data["choices"][0]["message"]["content"], int(data["usage"]["completion_tokens"]), seconds


def rate(host: str, port: int, prompt: str, max_tokens: int, concurrent: int) -> tuple[float, list[str]]:
    """Aggregate tok/s of `concurrent` identical requests sent at once, and their texts."""
    out: list[tuple[str, int, float] | BaseException] = [RuntimeError("not run")] * concurrent

    def one(i: int) -> None:
        try:
            out[i] = chat(host, port, prompt, max_tokens)
        except BaseException as exc:  # noqa: BLE001 — reported by the caller below
            out[i] = exc

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrent)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return sum(r[1] for r in out) / wall, [r[0] for r in out]  # type: ignore[index]


def metrics(host: str, port: int) -> dict[str, float]:
    """The coordinator's pipeserve_spec_* figures."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("pipeserve_spec")}


def single_rate(worker: ReferenceWorker, prompt: str, max_tokens: int, concurrent: int) -> tuple[float, list[str]]:
    """Tok/s of single-process mlx-lm over `concurrent` requests answered one at a time, and their texts."""
    replies = [worker.call("chat", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens)
               for _ in range(concurrent)]
    return sum(r["tokens"] for r in replies) / sum(r["seconds"] for r in replies), [r["text"] for r in replies]


def measure(systems: dict, prompt: str, tokens: int, concurrent: int, rounds: int) -> tuple[dict, dict]:
    """Each system's rates over `rounds` (order rotated every round) and its last texts."""
    names = list(systems)
    got: dict[str, list[float]] = {name: [] for name in names}
    texts: dict[str, list[str]] = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            system = systems[name]
            if isinstance(system, ReferenceWorker):
                value, answer = single_rate(system, prompt, tokens, concurrent)
            else:
                value, answer = rate(system.host, system.port, prompt, tokens, concurrent)
            got[name].append(value)
            texts[name] = answer
    return got, texts


def start_pipeline(lan: Lan | None, model: Path, workdir: Path, splits: list[tuple[int, int]],
                   args: argparse.Namespace, cluster: dict[str, object],
                   port_base: int) -> PipelineSystem | LanPipelineSystem:
    """One pipeline as the demo runs it (OpenBLAS, 1 thread per stage, every core for a SOLO step), on
    loopback or across `lan`; prompt cache off (every request pays its prefill)."""
    env = {"PIPESERVE_BLAS": args.blas, "OPENBLAS_NUM_THREADS": "1"}
    # A generous stall timeout: the three systems share the cores.
    cluster = {**cluster, "stall_timeout_s": 300, "prompt_cache_bytes": 0}
    if lan is None:
        return PipelineSystem(model, workdir, splits, threads=1, solo_threads=CORES, env=env, model_name="bench",
                              cluster=cluster)
    return LanPipelineSystem(lan, model, workdir, splits, solo_threads=CORES, env=env, model_name="bench",
                             cluster=cluster, port_base=port_base)


def main(argv: list[str] | None = None) -> int:
    """Run the side-by-side measurement and print the tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--draft", type=int, default=4)
    p.add_argument("--blas", default="openblas", choices=("reference", "openblas"),
                   help="openblas: what the demo runs; reference: mlx-cpu's own BLAS (for a CPU OpenBLAS fails on)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of: " + ", ".join(WORKLOADS))
    p.add_argument("--requests", default="1,4", help="comma list of concurrent request counts")
    p.add_argument("--profile", default="", help="an emulated LAN link profile (e2e/lan/profiles.py: "
                   + ", ".join(PROFILES) + "): every stage in its own namespace; needs root. Default: loopback, "
                   "one namespace")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--draft-model", type=int, default=0, metavar="LAYERS",
                   help="draft with an early-exit draft of the model (its first LAYERS layers and its head: "
                        "pipeserve make-draft-model) instead of prompt lookup")
    args = p.parse_args(argv)
    model = prepare_model(args.model)
    splits = compute_split(json.loads((model / "config.json").read_text()), args.stages)
    started, load_before = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as around:
        if args.profile:
            lan = around.enter_context(Lan(PROFILES[args.profile], args.stages))
            around.enter_context(joined(lan.control))  # this thread, its threads and children talk over the bridge
        systems: dict = {}
        try:
            drafting: dict[str, object] = {"speculative_tokens": args.draft}
            if args.draft_model:
                from orchestrator.models.early_exit import make_early_exit_draft

                drafting["draft_model"] = str(make_early_exit_draft(model, Path(tmp) / "draft", args.draft_model))
            for i, (name, cluster) in enumerate((("spec", drafting), ("plain", {"speculative_tokens": 0}))):
                systems[name] = start_pipeline(lan if args.profile else None, model, Path(tmp) / name, splits, args,
                                               cluster, port_base=39600 + 50 * i)
            systems["single"] = ReferenceWorker(model, {"PIPESERVE_BLAS": args.blas,
                                                        "OPENBLAS_NUM_THREADS": str(CORES)},
                                                Path(tmp) / "single.log")
            rows = []
            for workload in args.workloads.split(","):
                for concurrent in (int(n) for n in args.requests.split(",")):
                    spec = systems["spec"]
                    before = metrics(spec.host, spec.port)
                    got, texts = measure(systems, WORKLOADS[workload], args.tokens, concurrent, args.rounds)
                    after = metrics(spec.host, spec.port)
                    keys = [f"pipeserve_spec_{k}_total" for k in ("passes", "drafted_tokens", "accepted_tokens")]
                    passes, drafted, accepted = (after[k] - before[k] for k in keys)
                    # Each system's best round: another user's load (or our other two systems' idle
                    # threads) only ever slows a round down, as in the main benchmark (e2e/bench/report.py).
                    best = {name: max(v) for name, v in got.items()}
                    steps = {name: [s.get("step_ms") or 0.0 for s in systems[name].health()["stages"]]
                             for name in ("spec", "plain")}
                    rows.append(Row(workload, concurrent, best, accepted / drafted if drafted else 0.0,
                                    (accepted + passes) / passes if passes else 0.0,
                                    texts["spec"] == texts["plain"] == texts["single"], steps,
                                    drafted / passes if passes else 0.0, got))
                    print(f"bench: {workload} x{concurrent}: " + ", ".join(
                        f"{k} {' / '.join(f'{x:.2f}' for x in v)}" for k, v in got.items()) + " tok/s (each round)",
                        file=sys.stderr)
        finally:
            for s in systems.values():
                s.stop()
    print_tables(args, rows, started, (load_before, os.getloadavg()[0]))
    return 0


def print_tables(args: argparse.Namespace, rows: list[Row], started: float, load: tuple[float, float]) -> None:
    """The Markdown tables of docs/benchmark.md."""
    where = f" --profile {args.profile}" if args.profile else ""
    print(f"Generated by `python -m e2e.bench.speculation --model {args.model} --tokens {args.tokens} "
          f"--rounds {args.rounds} --draft {args.draft} --blas {args.blas}{where} --stages {args.stages}"
          f"{f' --draft-model {args.draft_model}' if args.draft_model else ''}` on "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
          f"in {(time.time() - started) / 60:.1f} min; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}; load average {load[0]:.1f} before, "
          f"{load[1]:.1f} after. Rates: each system's best of the {args.rounds} rounds; with ÷ without also "
          f"round by round (both measured in the same round), to show how far one round's noise reaches.\n")
    print("| workload | requests | single-process tok/s | pipeline tok/s | pipeline ÷ single | with speculation "
          "tok/s | with ÷ without | with ÷ without, each round (median) | with ÷ single | acceptance | "
          "tokens per pass | same text (all three) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        best, c = r.rate, r.requests
        single = f"{best['single']:.2f}" + (" (one at a time)" if c > 1 else "")
        each = [a / b for a, b in zip(r.rounds["spec"], r.rounds["plain"])]
        print(f"| {r.workload} | {c} | {single} | {best['plain']:.2f} | {best['plain'] / best['single']:.2f}× | "
              f"{best['spec']:.2f} | **{best['spec'] / best['plain']:.2f}×** | "
              f"{', '.join(f'{x:.2f}' for x in each)} ({statistics.median(each):.2f}) | "
              f"{best['spec'] / best['single']:.2f}× | {r.acceptance:.0%} | {r.tokens_per_pass:.2f} | "
              f"{'yes' if r.same_text else 'NO'} |")
    print("\nWhat a pass costs (1 request): each stage's step time at the end of the workload (the stages' EMA of "
          "their last ~10 steps, from GET /health; with speculation most steps are passes) and drafts per pass:\n")
    print("| workload | stage steps ms with speculation | stage steps ms without | with ÷ without | drafts per pass |")
    print("|---|---|---|---|---|")
    for workload, c, _, _, _, _, steps, drafts, _ in rows:
        if c == 1:
            ratio = sum(steps["spec"]) / sum(steps["plain"]) if sum(steps["plain"]) else 0.0
            print(f"| {workload} | {' + '.join(f'{x:.1f}' for x in steps['spec'])} | "
                  f"{' + '.join(f'{x:.1f}' for x in steps['plain'])} | {ratio:.2f} | {drafts:.2f} |")
    plain = {(r.workload, r.requests): r.rate["plain"] for r in rows}
    single = {(r.workload, r.requests): r.rate["single"] for r in rows}
    print("\nPer-token targets of the pipeline without speculation (end-to-end wall time, prefill included):\n")
    print("| workload | pipeline ×1 ÷ single ×1 (target ≥ 0.95) | pipeline ×4 aggregate ÷ pipeline ×1 "
          "(target ≥ 2.0) |")
    print("|---|---|---|")
    for w in dict.fromkeys(w for w, _ in plain):
        one = f"{plain[w, 1] / single[w, 1]:.2f}" if (w, 1) in plain else "–"
        four = f"{plain[w, 4] / plain[w, 1]:.2f}" if (w, 4) in plain and (w, 1) in plain else "–"
        print(f"| {w} | {one} | {four} |")


if __name__ == "__main__":
    sys.exit(main())
