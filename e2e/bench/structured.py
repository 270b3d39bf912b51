"""Structured output's cost: decode tokens/s with a JSON schema ÷ without, at 1 and 8 concurrent requests.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.structured [--vocab 8192] [--hidden 256] [--tokens 64]
       [--rounds 3] [--concurrency 1,8]

A local 2-stage cluster of a random test model (the vocabulary sets the mask's cost: use a
real model's size, e.g. --vocab 32000, for a realistic figure). Each round sends the same
greedy requests with and without `response_format` (a schema with one long string field, so
a random model keeps writing until max_tokens, the same token count either way); decode
throughput is the completion tokens of a round over the time from its first token to its
last. Prints a table; the target is a ratio of at least 0.85.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import openai

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.testmodels.llama import make_test_model

# minLength: the string cannot close before max_tokens, so both modes decode the same token count.
SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "minLength": 2000}}, "required": ["note"],
          "additionalProperties": False}


def _round(client: openai.OpenAI, model: str, concurrency: int, tokens: int, constrained: bool) -> tuple[float, float]:
    """Decode tokens/s of `concurrency` simultaneous streamed requests, and tokens per request."""
    firsts, lasts, counts = [], [], []
    lock = threading.Lock()

    def one(i: int) -> None:
        extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}} \
            if constrained else {}
        first = last = None
        n = 0
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Write note {i}"}], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}, **extra)
        for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:  # any chunk: a byte token may hold text back, not time
                first = first or now
                if chunk.choices[0].finish_reason:
                    last = now
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        with lock:
            firsts.append(first)
            lasts.append(last)
            counts.append(n - 1)  # the first token is prefill's

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (max(lasts) - min(firsts)), sum(counts) / len(counts) + 1


def main() -> int:
    """Run the benchmark and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="1,8")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-structured-") as tmp:
        model = make_test_model(Path(tmp) / "model", vocab=args.vocab, hidden=args.hidden, layers=args.layers,
                                heads=8, kv_heads=4)
        half = args.layers // 2
        cluster = LocalPipeline(Path(tmp) / "cluster", model, [(0, half - 1), (half, args.layers - 1)],
                                threads=1, cluster={"max_batch": 8}).start()
        try:
            client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
            _round(client, model.name, 1, 8, True)  # warm: the stage builds llguidance's tokenizer once
            rows = []
            for c in (int(x) for x in args.concurrency.split(",")):
                plain, schema = [], []
                for _ in range(args.rounds):  # interleaved, so a machine's drift hits both alike
                    plain.append(_round(client, model.name, c, args.tokens, False))
                    schema.append(_round(client, model.name, c, args.tokens, True))
                rows.append((c, statistics.median(t for t, _ in plain), statistics.median(t for t, _ in schema),
                             statistics.mean(n for _, n in plain), statistics.mean(n for _, n in schema)))
        finally:
            cluster.stop()
    print(f"vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers, 2 stages, {args.tokens} tokens, "
          f"median of {args.rounds} rounds")
    print("| concurrent | plain tok/s | json_schema tok/s | ratio | tokens/request (plain, schema) |")
    print("|---:|---:|---:|---:|---:|")
    for c, plain_tps, schema_tps, plain_n, schema_n in rows:
        ratio = schema_tps / plain_tps
        print(f"| {c} | {plain_tps:.1f} | {schema_tps:.1f} | {ratio:.2f} | {plain_n:.0f}, {schema_n:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
