"""The coordinator's HTTP API: OpenAI-compatible completions over the pipeline.

Standard library HTTP server (the engine does not import Flask), one thread per request.
Each request thread tokenizes, submits to the scheduler, then detokenizes the token
events it receives, applies stop strings and writes JSON or server-sent events.
"""

from __future__ import annotations

import json
import queue
from http.server import ThreadingHTTPServer
from typing import Any, Callable

from pydantic import ValidationError

from ..httpjson import JsonHandler
from ..logs import EventLogger
from . import openai_schema as oa
from .metrics import Metrics
from .pipeline import Failed, Finished, GenerationParams, NotReady, Pipeline, TokenEvent

MAX_BODY = 4 * 1024 * 1024
EVENT_TIMEOUT = 600.0  # the scheduler always answers; this only guards against a bug hanging a client


class Coordinator:
    """Everything a request handler needs: pipeline, tokenizer, model name, metrics."""

    def __init__(self, pipeline: Pipeline, tokenizer: Any, model_name: str, metrics: Metrics, log: EventLogger) -> None:
        self.pipeline = pipeline
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.log = log

    def health(self) -> tuple[int, dict]:
        """Status code and body of GET /health."""
        h = self.pipeline.health
        body = {
            "status": h.state, "ready": h.ready, "reason": h.reason, "model": self.model_name,
            "in_flight": h.in_flight,
            "stages": [{"id": s.node_id, "address": s.address, "state": "up" if s.connected else "down",
                        "last_seen_s": s.last_seen_s, **s.stats} for s in h.stages],
        }
        return (200 if h.ready else 503), body

    def models(self) -> tuple[int, dict]:
        """GET /v1/models: 503 until the pipeline is ready (a router reads it as warming up)."""
        h = self.pipeline.health
        if not h.ready:
            return 503, oa.ApiError(503, f"pipeline is {h.state}: {h.reason}", "service_unavailable").body()
        return 200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                  "owned_by": "pipeserve"}]}

    def prepare(self, kind: str, body: dict) -> tuple[oa.ChatRequest | oa.CompletionRequest, list[int], GenerationParams]:
        """Validate a request and tokenize it; raises ApiError (4xx) on bad input."""
        try:
            req = (oa.ChatRequest if kind == "chat" else oa.CompletionRequest).model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise oa.ApiError(400, f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param=param) from None
        if req.model != self.model_name:
            raise oa.ApiError(404, f"The model '{req.model}' does not exist; this server serves '{self.model_name}'",
                              param="model", code="model_not_found")
        if kind == "chat":
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
            prompt = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        elif isinstance(req.prompt, str):
            prompt = list(self.tokenizer.encode(req.prompt))
        else:
            prompt = list(req.prompt)
            vocab = self.pipeline_vocab()
            if any(not 0 <= t < vocab for t in prompt):
                raise oa.ApiError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        if not prompt:
            raise oa.ApiError(400, "the prompt is empty", param="prompt")
        limit = self.pipeline.context_length
        if len(prompt) >= limit:
            raise oa.ApiError(400, f"This model's maximum context length is {limit} tokens; the prompt has "
                                   f"{len(prompt)}", param="messages" if kind == "chat" else "prompt",
                              code="context_length_exceeded")
        room = limit - len(prompt)
        wanted = req.token_limit
        if wanted is not None and wanted > room:
            raise oa.ApiError(400, f"This model's maximum context length is {limit} tokens; you requested "
                                   f"{len(prompt) + wanted} ({len(prompt)} in the prompt, {wanted} to generate)",
                              param="max_tokens", code="context_length_exceeded")
        params = GenerationParams(max_tokens=wanted or room, temperature=req.temperature, top_p=req.top_p,
                                  seed=req.seed, top_logprobs=req.top_k if (req.top_k or _wants_logprobs(req)) else 0)
        return req, prompt, params

    def pipeline_vocab(self) -> int:
        """Vocabulary size (token ids accepted in a completions prompt)."""
        return len(self.tokenizer.vocab) if hasattr(self.tokenizer, "vocab") else 1 << 31

    def token_text(self, token: int) -> str:
        """A single token as text (for logprobs)."""
        return self.tokenizer.decode([token])


def _wants_logprobs(req: oa.ChatRequest | oa.CompletionRequest) -> bool:
    return bool(req.logprobs) if isinstance(req, oa.ChatRequest) else req.logprobs is not None


class Generator:
    """Turns a submitted generation's token events into text pieces, honouring stop strings."""

    def __init__(self, coordinator: Coordinator, req: Any, prompt: list[int], params: GenerationParams) -> None:
        self.c = coordinator
        self.req = req
        self.prompt = prompt
        self.params = params
        self.detok = coordinator.tokenizer.detokenizer
        self.text = ""
        self.emitted = 0
        self.completion_tokens = 0
        self.logprobs: list[tuple[str, float, list[tuple[str, float]]]] = []
        self.finish: str | None = None

    def pieces(self, on_piece: Callable[[str, list], None]) -> None:
        """Run the generation, calling on_piece(new_text, new_logprob_entries); raises ApiError on failure."""
        try:
            gen = self.c.pipeline.submit(self.prompt, self.params)
        except NotReady as exc:
            raise oa.ApiError(503, str(exc), "service_unavailable") from None
        self.c.metrics.add_prompt_tokens(len(self.prompt))
        try:
            self._consume(gen, on_piece)
        finally:
            if self.finish is None:
                gen.cancel()

    def _consume(self, gen: Any, on_piece: Callable[[str, list], None]) -> None:
        stops = self.req.stop
        pending_lp: list = []
        while True:
            try:
                event = gen.events.get(timeout=EVENT_TIMEOUT)
            except queue.Empty:
                raise oa.ApiError(504, "the pipeline did not answer in time", "timeout") from None
            if isinstance(event, Failed):
                raise oa.ApiError(event.status, event.message, "server_error" if event.status >= 500 else "rate_limit")
            if isinstance(event, TokenEvent):
                self.completion_tokens += 1
                if self.params.top_logprobs or _wants_logprobs(self.req):
                    entry = (self.c.token_text(event.token), event.logprob,
                             [(self.c.token_text(t), lp) for t, lp in event.top][: self.req.top_k])
                    pending_lp.append(entry)
                if event.token not in self.c.pipeline.eos_ids:
                    self.detok.add_token(event.token)
                    self.text += self.detok.last_segment
            else:
                assert isinstance(event, Finished)
                self.detok.finalize()
                self.text += self.detok.last_segment
                self.finish = event.reason
            hit = min((i for i in (self.text.find(s) for s in stops) if i >= 0), default=-1)
            if hit >= 0:
                self.text = self.text[:hit]
                self.finish = "stop"
            safe = len(self.text) if self.finish else len(self.text) - _held_back(self.text, stops)
            if safe > self.emitted or pending_lp:
                on_piece(self.text[self.emitted:safe], pending_lp)
                self.emitted = max(self.emitted, safe)
                pending_lp = []
            if self.finish:
                return


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that could begin a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best


class Handler(JsonHandler):
    """HTTP/1.1 handler; `self.server.coordinator` is the Coordinator."""

    server_version = "pipeserve-coordinator"

    @property
    def c(self) -> Coordinator:
        return self.server.coordinator  # type: ignore[attr-defined]

    @property
    def event_log(self) -> EventLogger:
        return self.c.log

    def _json(self, status: int, body: dict) -> None:
        self.send_json(status, body)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?")[0]
        if path == "/health":
            self._json(*self.c.health())
        elif path == "/v1/models":
            self._json(*self.c.models())
        elif path == "/metrics":
            self.send_metrics(self.c.metrics.render())
        else:
            self._json(404, oa.ApiError(404, f"no route {path}", code="not_found").body())

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        kind = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}.get(path)
        status = 200
        try:
            if kind is None:
                raise oa.ApiError(404, f"no route {path}", code="not_found")
            body = self._read_json()
            req, prompt, params = self.c.prepare(kind, body)
            gen = Generator(self.c, req, prompt, params)
            if req.stream:
                self._stream(kind, gen)
            else:
                self._complete(kind, gen)
        except oa.ApiError as exc:
            status = exc.status
            self._json(exc.status, exc.body())
        except (BrokenPipeError, ConnectionResetError):
            status = 499
        except Exception:  # a bug must answer 500 with a body, not drop the connection
            self.c.log.error("http.internal_error", exc_info=True, path=path)
            status = 500
            self._json(500, oa.ApiError(500, "internal error; see the coordinator log", "server_error").body())
        finally:
            self.c.metrics.count_request(path if kind else "other", status)

    def _read_json(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise oa.ApiError(411, "Content-Length required") from None
        if length > MAX_BODY:
            raise oa.ApiError(413, f"request body over {MAX_BODY} bytes")
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise oa.ApiError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise oa.ApiError(400, "request body must be a JSON object")
        return body

    def _logprobs_block(self, kind: str, entries: list) -> Any:
        if not entries:
            return None
        return oa.chat_logprobs(entries) if kind == "chat" else oa.completion_logprobs(entries)

    def _complete(self, kind: str, gen: Generator) -> None:
        entries: list = []
        gen.pieces(lambda _text, lp: entries.extend(lp))
        rid = oa.completion_id(kind)
        logprobs = self._logprobs_block(kind, entries) if _wants_logprobs(gen.req) else None
        self._json(200, oa.response(kind, rid, self.c.model_name, gen.text, gen.finish,
                                    oa.usage(len(gen.prompt), gen.completion_tokens), logprobs))

    def _stream(self, kind: str, gen: Generator) -> None:
        rid = oa.completion_id(kind)
        started = False

        def start() -> None:
            nonlocal started
            if not started:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                started = True

        def event(obj: Any) -> None:
            start()
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def piece(text: str, lp: list) -> None:
            logprobs = self._logprobs_block(kind, lp) if _wants_logprobs(gen.req) else None
            event(oa.response(kind, rid, self.c.model_name, text, None, None, logprobs, stream=True))

        try:
            gen.pieces(piece)
        except oa.ApiError as exc:
            if not started:
                raise
            event(exc.body())  # the openai client raises on an "error" event
        else:
            event(oa.response(kind, rid, self.c.model_name, "", gen.finish, None, None, stream=True))
            if gen.req.include_usage:
                body = oa.response(kind, rid, self.c.model_name, "", None,
                                   oa.usage(len(gen.prompt), gen.completion_tokens), None, stream=True)
                body["choices"] = []
                event(body)
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def make_server(coordinator: Coordinator, host: str, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server bound to (host, port) serving the coordinator."""
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.coordinator = coordinator  # type: ignore[attr-defined]
    return server
