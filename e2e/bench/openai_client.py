"""A client of any OpenAI-compatible server (pipeserve's coordinator, `mlx_lm.server`, mlx-lm's
pipeline): streamed `POST /v1/completions` with a text prompt, timed per event, and the rates
computed alike for every server.

Servers differ in how many tokens one streamed event carries (mlx_lm.server holds back text that is
not yet whole UTF-8), so token counts come from the stream's `usage` block
(`stream_options.include_usage`) and a rate is tokens over the time between the first and the last
event, never one event per token.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from dataclasses import dataclass

from e2e.bench.client import together


@dataclass
class Answer:
    """One streamed completion as the client saw it (perf_counter seconds)."""

    t_submit: float
    t_first: float          # first event carrying text or a finish
    t_last: float           # last such event
    prompt_tokens: int
    tokens: int             # completion tokens (usage), or the events counted
    finish: str | None

    @property
    def ttft(self) -> float:
        """Request sent -> first token."""
        return self.t_first - self.t_submit

    @property
    def decode_rate(self) -> float:
        """Tokens per second after the first one (NaN under two tokens)."""
        span = self.t_last - self.t_first
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else float("nan")


def complete(port: int, model: str, prompt: str, max_tokens: int, host: str = "127.0.0.1",
             timeout: float = 1800.0, logit_bias: dict[int, float] | None = None) -> Answer:
    """One streamed completion, temperature 0 (with `logit_bias` when given: every server here
    takes OpenAI's field)."""
    fields = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
              "stream": True, "stream_options": {"include_usage": True}}
    if logit_bias:
        fields["logit_bias"] = {str(t): b for t, b in logit_bias.items()}
    body = json.dumps(fields).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status} from :{port}: {resp.read()[:300]!r}")
        first = last = None
        events, usage, finish = 0, {}, None
        for raw in resp:
            if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
                continue
            t = time.perf_counter()
            event = json.loads(raw[6:])
            if "error" in event:
                raise RuntimeError(f"stream error from :{port}: {event['error']}")
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                if choice.get("text") or choice.get("finish_reason"):
                    first = first if first is not None else t
                    last = t
                    events += bool(choice.get("text"))
                finish = choice.get("finish_reason") or finish
    finally:
        conn.close()
    if first is None:
        raise RuntimeError(f"no token from :{port}")
    return Answer(t0, first, last, int(usage.get("prompt_tokens", 0)),
                  int(usage.get("completion_tokens", events)), finish)


def concurrent(port: int, model: str, prompts: list[str], max_tokens: int, host: str = "127.0.0.1",
               logit_bias: dict[int, float] | None = None) -> list[Answer]:
    """len(prompts) completions started together, one thread each."""
    return together([lambda p=p: complete(port, model, p, max_tokens, host, logit_bias=logit_bias) for p in prompts])


def cut_short(answers: list[Answer], max_tokens: int) -> int:
    """How many answers ended before the length asked (an end-of-sequence token, a stop)."""
    return sum(a.tokens < max_tokens for a in answers)


def throughput(answers: list[Answer]) -> float:
    """Completion tokens of all answers per second, from the first request sent to the last token."""
    return sum(a.tokens for a in answers) / (max(a.t_last for a in answers) - min(a.t_submit for a in answers))


def decode_rates(answers: list[Answer]) -> float:
    """The sum of concurrent answers' decode rates, each over its own first to last token: what the
    requests decoding together make per second once all of them decode (the plan's aggregate), what
    their clients see summed. A window from the first answer's first token to the last token would
    also hold the prefills of the requests still waiting for theirs (10-15 % of 64-token answers at
    8). Only for answers run to a length asked (`cut_short` 0): one of a token or two has no rate."""
    rates = [a.decode_rate for a in answers]
    return float("nan") if any(math.isnan(r) for r in rates) else sum(rates)
