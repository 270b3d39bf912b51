"""The benchmark's HTTP client: streamed completions and the decode rates computed from them.

Requests go to the coordinator's `POST /v1/completions` with a token-id prompt,
temperature 0, `stream: true` and `logprobs: 0`, so that every token arrives as its own
server-sent event and its arrival time is the token's time.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

# A decode measurement cut short by --max-seconds keeps at least this many tokens.
MIN_TOKENS = 8

T = TypeVar("T")


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    t_submit: float
    times: list[float]          # arrival time of each token (perf_counter)
    texts: list[str]
    logprobs: list[float]
    finish: str | None


def get_json(port: int, path: str, host: str = "127.0.0.1") -> dict:
    """GET a JSON document from the coordinator (e.g. /health)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


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
    times: list[float] = []
    texts: list[str] = []
    lps: list[float] = []
    finish = None
    while True:
        line = resp.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: "):
            continue
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


def together(calls: list[Callable[[], T]]) -> list[T]:
    """Run the calls at once, one thread each, released together by a barrier; their results in
    order, or the first exception one of them raised."""
    results: list[T | BaseException | None] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def one(i: int) -> None:
        try:
            barrier.wait()
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def run_concurrent(port: int, model: str, prompts: list[list[int]], max_tokens: int,
                   max_seconds: float | None = None) -> list[Stream]:
    """Start len(prompts) streamed requests at once, each from its own thread."""
    def call(prompt: list[int]) -> Callable[[], Stream]:
        # the deadline starts when the call is released, with the others
        return lambda: stream_completion(port, model, prompt, max_tokens,
                                         time.perf_counter() + max_seconds if max_seconds else None)

    return together([call(p) for p in prompts])


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
