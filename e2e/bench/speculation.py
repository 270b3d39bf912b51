"""Speculative decoding (prompt lookup) on a 2-stage loopback pipeline: tok/s with it ÷ without, side by side.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.speculation [--model smollm2] [--tokens 96] [--rounds 2]
       [--draft 4] [--blas reference]

Two pipelines of the same model run at once (`speculative_tokens = --draft` and `= 0`); each workload is
measured on both in turn, round by round (order swapped every round), at 1 request and at 4 concurrent.
A request is a non-streamed `POST /v1/chat/completions` at temperature 0; its rate is completion tokens ÷
wall time from sending to the answer (prefill included). At 4 the aggregate is all tokens ÷ the wall time
of the four. Answers must be the same text with and without speculation (greedy is exact). Acceptance is
read from each coordinator's /metrics. Prints a Markdown table (the one in docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from e2e.bench.procs import PipelineSystem, prepare_model

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
WORKLOADS = {
    "free chat": "Tell me a story about a lighthouse keeper who finds a message in a bottle.",
    "code edit": f"Rewrite this code with one change: rename the variable `subtotal` to `net`. "
                 f"Reply with the whole code only.\n\n```python\n{CODE}```",
    "tool-call echo": f"Call the function book_hotel with exactly these JSON arguments and nothing else: "
                      f"{TOOL_ARGS}\nReply with the JSON arguments only.",
}


def chat(port: int, prompt: str, max_tokens: int) -> tuple[str, int, float]:
    """One non-streamed greedy chat completion: (text, completion tokens, seconds)."""
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
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


def rate(port: int, prompt: str, max_tokens: int, concurrent: int) -> tuple[float, list[str]]:
    """Aggregate tok/s of `concurrent` identical requests sent at once, and their texts."""
    out: list[tuple[str, int, float] | BaseException] = [RuntimeError("not run")] * concurrent

    def one(i: int) -> None:
        try:
            out[i] = chat(port, prompt, max_tokens)
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


def metrics(port: int) -> dict[str, float]:
    """The coordinator's pipeserve_spec_* figures."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("pipeserve_spec")}


def main(argv: list[str] | None = None) -> int:
    """Run the side-by-side measurement and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--draft", type=int, default=4)
    p.add_argument("--blas", default="reference", choices=("reference", "openblas"))
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of: " + ", ".join(WORKLOADS))
    p.add_argument("--requests", default="1,4", help="comma list of concurrent request counts")
    args = p.parse_args(argv)
    model = prepare_model(args.model)
    n = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    splits = [(0, n // 2 - 1), (n // 2, n - 1)]
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        systems = {}
        try:
            for name, k in (("spec", args.draft), ("plain", 0)):
                # The reference BLAS: this checkout's OpenBLAS wheel may not run on the host's CPU (see
                # engine/blas.py); a generous stall timeout, since the two pipelines share the cores.
                systems[name] = PipelineSystem(model, Path(tmp) / name, splits, threads=1, solo_threads=None,
                                               env={"PIPESERVE_BLAS": args.blas}, model_name="bench",
                                               cluster={"speculative_tokens": k, "stall_timeout_s": 300})
            rows = []
            for workload in args.workloads.split(","):
                prompt = WORKLOADS[workload]
                for concurrent in (int(n) for n in args.requests.split(",")):
                    got: dict[str, list[float]] = {"spec": [], "plain": []}
                    texts: dict[str, list[str]] = {}
                    before = metrics(systems["spec"].port)
                    for r in range(args.rounds):
                        for name in (("spec", "plain") if r % 2 == 0 else ("plain", "spec")):
                            value, answer = rate(systems[name].port, prompt, args.tokens, concurrent)
                            got[name].append(value)
                            texts[name] = answer
                    after = metrics(systems["spec"].port)
                    keys = [f"pipeserve_spec_{k}_total" for k in ("passes", "drafted_tokens", "accepted_tokens")]
                    passes, drafted, accepted = (after[k] - before[k] for k in keys)
                    spec, plain = statistics.median(got["spec"]), statistics.median(got["plain"])
                    rows.append((workload, concurrent, plain, spec, spec / plain,
                                 accepted / drafted if drafted else 0.0,
                                 (accepted + passes) / passes if passes else 0.0, texts["spec"] == texts["plain"]))
                    print(f"bench: {workload} x{concurrent}: {plain:.2f} -> {spec:.2f} tok/s", file=sys.stderr)
        finally:
            for s in systems.values():
                s.stop()
    print(f"Generated by `python -m e2e.bench.speculation --model {args.model} --tokens {args.tokens} "
          f"--rounds {args.rounds} --draft {args.draft} --blas {args.blas}` on "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
          f"in {(time.time() - started) / 60:.1f} min; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}.\n")
    print("| workload | requests | tok/s without | tok/s with | with ÷ without | acceptance | tokens per pass | "
          "same text |")
    print("|---|---|---|---|---|---|---|---|")
    for workload, c, plain, spec, ratio, acc, per_pass, same in rows:
        print(f"| {workload} | {c} | {plain:.2f} | {spec:.2f} | **{ratio:.2f}×** | {acc:.0%} | {per_pass:.2f} | "
              f"{'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
