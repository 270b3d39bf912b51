"""The reference a user compares with: a real `python -m mlx_lm.server` process, and answers of
both servers reduced to what must be equal (text, tool calls, finish reason, usage)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import requests

from orchestrator.proc import ChildProcess, free_port

STARTUP_TIMEOUT_S = 120.0


@dataclass
class ReferenceServer:
    """mlx_lm.server on one model; requests name the model by its path (its own convention)."""

    model_dir: Path
    log_path: Path
    port: int = 0
    proc: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ReferenceServer":
        """Start it (no prompt cache: every answer computed from scratch, as pipeserve does)."""
        self.port = free_port()
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model_dir), "--host", "127.0.0.1",
                "--port", str(self.port), "--prompt-cache-size", "0", "--max-tokens", "512"]
        self.proc = ChildProcess.spawn("mlx_lm.server", argv, self.log_path)
        self.proc.wait_ready(lambda: requests.get(self.url + "/health", timeout=1).status_code == 200,
                             "mlx_lm.server's /health", STARTUP_TIMEOUT_S)
        return self

    def stop(self) -> None:
        """Stop the process."""
        if self.proc is not None:
            self.proc.stop()

    def client(self) -> openai.OpenAI:
        """The official client, pointed at it."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@dataclass(frozen=True)
class Answer:
    """What must be equal between the two servers for one request."""

    text: str
    tool_calls: tuple[tuple[str, Any], ...]
    finish: str | None
    usage: tuple[int, int, int] | None


def _calls(calls: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((c.function.name, json.loads(c.function.arguments)) for c in calls or ())


def ask(client: openai.OpenAI, model: str, kind: str, body: dict, stream: bool) -> Answer:
    """One request through the official client, reduced to an Answer (streamed or not)."""
    known = {"messages", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "logit_bias", "tools",
             "tool_choice", "presence_penalty", "frequency_penalty"}
    extra = {k: v for k, v in body.items() if k not in known}
    kwargs = {k: v for k, v in body.items() if k in known}
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    if not stream:
        r = create(model=model, extra_body=extra, **kwargs)
        usage = (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens)
        choice = r.choices[0]
        if kind == "chat":
            return Answer(choice.message.content or "", _calls(choice.message.tool_calls), choice.finish_reason, usage)
        return Answer(choice.text, (), choice.finish_reason, usage)
    chunks = list(create(model=model, extra_body=extra, stream=True, stream_options={"include_usage": True}, **kwargs))
    text, calls, finish, usage = "", [], None, None
    for c in chunks:
        if c.usage is not None:
            usage = (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens)
        for choice in c.choices:
            if kind == "chat":
                text += choice.delta.content or ""
                calls += list(choice.delta.tool_calls or ())
            else:
                text += choice.text or ""
            finish = choice.finish_reason or finish
    indices = [c.index for c in calls]
    assert indices == list(range(len(calls))), f"streamed tool calls must be indexed 0, 1, ...: {indices}"
    return Answer(text, _calls(calls), finish, usage)
