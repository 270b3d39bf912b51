"""Killing a stage in the middle of an answer, and reading answers to compare them with their undisturbed
run: shared by the resume tests (tests/engine/test_resume.py, test_resume_apis.py) and the restarts-off
teardown test (tests/control/test_restarts_off_streams.py).

A kill is triggered by the answer's own progress, never by a fixed delay: after the n-th streamed
chunk the client read (`Killer` as an `on_chunk`), once the coordinator counted k more generated
tokens (`Killer.after_tokens`: an answer whose client sees nothing token by token — a non-streamed
one, a tool call held until it is complete), or once the request is in flight (`Killer.in_flight`).
"""

from __future__ import annotations

import json
import re
import signal
import threading
from dataclasses import dataclass, field
from typing import Callable

import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import wait_until


def metric(base_url: str, name: str) -> float:
    """One unlabelled counter or gauge of a coordinator's /metrics (0 when absent)."""
    text = requests.get(base_url + "/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def generated(base_url: str) -> int:
    """Tokens the coordinator generated and sent so far (regenerated ones on a resume are not counted)."""
    return int(metric(base_url, "pipeserve_generated_tokens_total"))


def resumed(base_url: str) -> int:
    """Answers the coordinator resumed exactly after a lost stage."""
    return int(metric(base_url, "pipeserve_requests_resumed_total"))


def in_flight(base_url: str) -> int:
    """Requests in flight, as /health says."""
    return int(requests.get(base_url + "/health", timeout=5).json()["in_flight"])


def ready(cluster: LocalPipeline) -> None:
    """Until the coordinator says ready again (after a respawned stage passed the probe)."""
    wait_until(lambda: requests.get(cluster.base_url + "/health", timeout=5).json().get("ready"), 120, 0.1,
               "the pipeline ready")


def held_tokens(cluster: LocalPipeline) -> list[int]:
    """How many tokens each answer the coordinator held had sent (its `request.held` log lines)."""
    return [int(n) for n in re.findall(r"request\.held .*?\btokens=(\d+)", cluster.output("coordinator", 400))]


class Killer:
    """Kills `stage` (`kill -9`) once triggered and starts it again on its address, as the control plane
    or an operator does; `resumed()` waits for that and says how many answers the coordinator resumed.

    As an `on_chunk(n)` it fires at the `at`-th chunk; `after_tokens(k)` and `in_flight()` arm a watcher
    instead. `before_respawn()`, if given, runs between the kill and the respawn (the pause lasts until
    it returns: a test waits there for what the pause must show)."""

    def __init__(self, cluster: LocalPipeline, stage: str, at: int = 0,
                 before_respawn: Callable[[], None] | None = None) -> None:
        self.cluster, self.stage, self.at = cluster, stage, at
        self.before_respawn = before_respawn
        self.fired = threading.Event()
        self._respawn = threading.Thread(target=self._again, daemon=True)

    def _again(self) -> None:
        if self.before_respawn is not None:
            self.before_respawn()
        self.cluster.respawn(self.stage)

    def __call__(self, n: int) -> None:
        if n >= self.at and not self.fired.is_set():
            self.fired.set()
            self.cluster.kill(self.stage, signal.SIGKILL)
            self._respawn.start()

    def _watch(self, until: Callable[[], bool], what: str) -> "Killer":
        def seen() -> bool:
            try:
                return until()
            except requests.RequestException:  # one poll of hundreds refused on a loaded machine: poll again
                return False

        def watch() -> None:
            wait_until(seen, 120, 0.005, what)
            self(self.at)

        threading.Thread(target=watch, daemon=True).start()
        return self

    def after_tokens(self, k: int) -> "Killer":
        """Fire once the coordinator generated `k` more tokens than now (arm it before the request)."""
        url, base = self.cluster.base_url, generated(self.cluster.base_url)
        return self._watch(lambda: generated(url) >= base + k, f"{k} tokens generated")

    def in_flight(self) -> "Killer":
        """Fire as soon as a request is in flight (with nothing generated yet: in its prefill)."""
        url, base = self.cluster.base_url, generated(self.cluster.base_url)
        return self._watch(lambda: in_flight(url) > 0 and generated(url) == base, "a request in its prefill")

    def resumed(self) -> int:
        """Once the stage is back: the coordinator's count of resumed answers."""
        assert self.fired.is_set(), "the stage was never killed"
        self._respawn.join(120)
        return resumed(self.cluster.base_url)


def answer(cluster: LocalPipeline, request: dict, on_chunk: Callable[[int], None] | None = None) -> dict:
    """Text, token log-probs, finish reason and usage of one /v1/completions answer, streamed or not;
    `on_chunk(n)` is called after the n-th streamed chunk (the moment a test kills a stage), or once
    (n = 0) when a non-streamed request is seen in flight."""
    url = cluster.base_url + "/v1/completions"
    if not request["stream"]:
        if on_chunk is not None:  # once the request is in flight (a fixed delay missed a fast answer)
            def when_in_flight() -> None:
                wait_until(lambda: in_flight(cluster.base_url) > 0, 60, 0.005, "the request in flight")
                on_chunk(0)

            threading.Thread(target=when_in_flight, daemon=True).start()
        r = requests.post(url, json=request, timeout=180)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return {"text": c["text"], "logprobs": c["logprobs"]["token_logprobs"], "tokens": c["logprobs"]["tokens"],
                "finish": c["finish_reason"], "usage": r.json()["usage"]["completion_tokens"]}
    out = {"text": "", "logprobs": [], "tokens": [], "finish": None, "usage": None, "done": False}
    with requests.post(url, json={**request, "stream_options": {"include_usage": True}}, stream=True,
                       timeout=180) as r:
        assert r.status_code == 200, r.text
        n = 0
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                out["done"] = True
                break
            event = json.loads(data)
            assert "error" not in event, event
            if event.get("usage"):
                out["usage"] = event["usage"]["completion_tokens"]
            for c in event.get("choices", []):
                out["text"] += c.get("text", "")
                if c.get("logprobs"):
                    out["logprobs"] += c["logprobs"]["token_logprobs"]
                    out["tokens"] += c["logprobs"]["tokens"]
                out["finish"] = c.get("finish_reason") or out["finish"]
            n += 1
            if on_chunk is not None:
                on_chunk(n)
    assert out.pop("done"), "the stream ended without [DONE]"
    return out


def chat_answer(cluster: LocalPipeline, request: dict, on_chunk: Callable[[int], None] | None = None) -> dict:
    """A streamed chat answer's content and finish reason; `on_chunk(n)` after the n-th chunk."""
    out = {"content": "", "finish": None}
    with requests.post(cluster.base_url + "/v1/chat/completions", json={**request, "stream": True}, stream=True,
                       timeout=180) as r:
        assert r.status_code == 200, r.text
        n = 0
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for c in event.get("choices", []):
                out["content"] += c.get("delta", {}).get("content") or ""
                out["finish"] = c.get("finish_reason") or out["finish"]
            n += 1
            if on_chunk is not None:
                on_chunk(n)
    return out


@dataclass
class Stream:
    """One SSE stream as it arrived: its events (name, data: parsed JSON, or the raw text of one that
    is not JSON, such as [DONE]) and how many comments (keep-alives) it carried."""

    events: list[tuple[str | None, object]] = field(default_factory=list)
    comments: int = 0
    first: threading.Event = field(default_factory=threading.Event)  # set at its first data event
    commented: threading.Event = field(default_factory=threading.Event)  # set at its first comment
    ended: threading.Event = field(default_factory=threading.Event)

    def read(self, url: str, body: dict, timeout: float = 180.0) -> "Stream":
        """POST `body` and read the answer's stream to its end (the connection closing)."""
        try:
            with requests.post(url, json=body, stream=True, timeout=timeout) as r:
                assert r.status_code == 200, r.text
                name = None
                for line in r.iter_lines():
                    if line.startswith(b":"):
                        self.comments += 1
                        self.commented.set()
                    elif line.startswith(b"event: "):
                        name = line[7:].decode()
                    elif line.startswith(b"data: "):
                        data = line[6:].decode()
                        try:
                            self.events.append((name, json.loads(data)))
                        except ValueError:
                            self.events.append((name, data))
                        name = None
                        self.first.set()
        finally:
            self.ended.set()
        return self

    def names(self) -> list[str | None]:
        """Each event's name (`event:` line), or for an unnamed one its JSON `type`/`object`, or its raw text."""
        return [n or (d.get("type") or d.get("object") if isinstance(d, dict) else d) for n, d in self.events]


def ended_with_an_error(stream: Stream) -> bool:
    """Whether the stream's last event is an error — an OpenAI `error` body, Anthropic's `error` event,
    Responses' `response.failed` — and nothing says it was complete ([DONE], message_stop, response.completed)."""
    if not stream.events:
        return False
    name, data = stream.events[-1]
    error = isinstance(data, dict) and "error" in data and name in (None, "error")
    last_is_error = error or name == "response.failed"
    complete = {"[DONE]", "message_stop", "response.completed", "response.incomplete"}
    return last_is_error and not complete & set(stream.names())


__all__ = ["Killer", "Stream", "answer", "chat_answer", "ended_with_an_error", "generated", "held_tokens",
           "in_flight", "metric", "ready", "resumed"]
