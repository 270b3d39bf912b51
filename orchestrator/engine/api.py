"""The coordinator's HTTP API: OpenAI-compatible completions over the pipeline.

Served by pipeserve's HTTP toolkit (`orchestrator.httpkit`: bounded connections, timeouts,
bodies), one thread per connection. Each request thread tokenizes, submits to the
scheduler, then detokenizes the token events it receives, applies stop strings and writes
JSON or server-sent events. A client that disconnects cancels its generation, streaming
or not.
"""

from __future__ import annotations

import math
import queue
import time
from typing import Any, Callable

from pydantic import ValidationError

from ..httpkit import App, Limits, OpenAIError, Raw, Request, Server, route
from ..logs import EventLogger
from . import openai_schema as oa
from .metrics import Metrics
from .pipeline import Failed, Finished, GenerationParams, NotReady, Pipeline, TokenEvent
from .routes import ROUTE_PATH, SIGNATURE_HEADER, RouteError, format_address, verify

MAX_BODY = 4 * 1024 * 1024
EVENT_TIMEOUT = 600.0  # the scheduler always answers; this only guards against a bug hanging a client
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks whether its client is still there
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
HEALTH_WAIT_MAX_S = 10.0  # a long poll of /health holds one server thread at most this long


class Coordinator:
    """Everything a request handler needs: pipeline, tokenizer, model name, metrics."""

    def __init__(self, pipeline: Pipeline, tokenizer: Any, model_name: str, metrics: Metrics, log: EventLogger,
                 secret: bytes = b"") -> None:
        self.pipeline = pipeline
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.log = log
        self.secret = secret  # the cluster secret: signs the control plane's stage-address requests

    def move_stage(self, request: Request) -> tuple[int, dict]:
        """POST ROUTE_PATH: a stage restarted on another node; re-point the pipeline to it (signed)."""
        if not self.secret:
            raise OpenAIError(404, "stage moves are not enabled here", code="not_found")
        try:
            stage, address = verify(self.secret, request.body_bytes(), request.header(SIGNATURE_HEADER),
                                    time.time(), len(self.pipeline.links))
        except RouteError as exc:
            self.log.warning("route.refused", reason=exc)
            raise OpenAIError(exc.status, str(exc), code="route_refused") from None
        self.pipeline.reroute(stage, address)
        return 200, {"stage": stage, "address": format_address(address)}

    def health(self, wait_s: float = 0.0, unless: str | None = None) -> tuple[int, dict]:
        """Status code and body of GET /health; with `unless` (a state) and `wait_s`, answered
        once the state is another or after wait_s (a long poll: the control plane's watcher
        hears of a lost stage at once)."""
        h = self.pipeline.health
        if unless is not None and wait_s > 0 and h.state == unless:
            h = self.pipeline.wait_while(unless, min(wait_s, HEALTH_WAIT_MAX_S))
        body = {
            "status": h.state, "ready": h.ready, "reason": h.reason, "model": self.model_name,
            "in_flight": h.in_flight,
            "stages": [{"id": s.node_id, "address": s.address,
                        "state": "wedged" if s.fault else "up" if s.connected else "down", "fault": s.fault,
                        "last_seen_s": s.last_seen_s, **s.stats} for s in h.stages],
        }
        return (200 if h.ready else 503), body

    def models(self) -> tuple[int, dict]:
        """GET /v1/models: 503 until the pipeline is ready (a router reads it as warming up)."""
        h = self.pipeline.health
        if not h.ready:
            raise OpenAIError(503, f"pipeline is {h.state}: {h.reason}", "service_unavailable")
        return 200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                  "owned_by": "pipeserve"}]}

    def prepare(self, kind: str, body: dict) -> tuple[oa.ChatRequest | oa.CompletionRequest, list[int], GenerationParams]:
        """Validate a request and tokenize it; raises OpenAIError (4xx) on bad input."""
        try:
            req = (oa.ChatRequest if kind == "chat" else oa.CompletionRequest).model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            raise OpenAIError(400, f"{param}: {first.get('msg')}" if param else str(first.get("msg")), param=param) from None
        if req.model != self.model_name:
            raise OpenAIError(404, f"The model '{req.model}' does not exist; this server serves '{self.model_name}'",
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
                raise OpenAIError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        if not prompt:
            raise OpenAIError(400, "the prompt is empty", param="prompt")
        limit = self.pipeline.context_length
        if len(prompt) >= limit:
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens; the prompt has "
                                   f"{len(prompt)}", param="messages" if kind == "chat" else "prompt",
                              code="context_length_exceeded")
        room = limit - len(prompt)
        wanted = req.token_limit
        if wanted is not None and wanted > room:
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens; you requested "
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

    def pieces(self, on_piece: Callable[[str, list], None], gone: Callable[[], bool] | None = None) -> None:
        """Run the generation, calling on_piece(new_text, new_logprob_entries); raises OpenAIError on
        failure, ConnectionResetError (the generation cancelled) once `gone()` says the client left."""
        try:
            gen = self.c.pipeline.submit(self.prompt, self.params)
        except NotReady as exc:
            raise OpenAIError(503, str(exc), "service_unavailable") from None
        self.c.metrics.add_prompt_tokens(len(self.prompt))
        try:
            self._consume(gen, on_piece, gone)
        finally:
            if self.finish is None:
                gen.cancel()

    def _consume(self, gen: Any, on_piece: Callable[[str, list], None], gone: Callable[[], bool] | None) -> None:
        stops = self.req.stop
        pending_lp: list = []
        deadline = time.monotonic() + EVENT_TIMEOUT
        next_check = time.monotonic() + DISCONNECT_POLL_S
        while True:
            try:
                event = gen.events.get(timeout=DISCONNECT_POLL_S if gone else EVENT_TIMEOUT)
            except queue.Empty:
                event = None
            now = time.monotonic()
            if gone is not None and now >= next_check:
                # Checked on a clock, not only when idle: tokens may arrive faster than the poll.
                next_check = now + DISCONNECT_POLL_S
                if gone():
                    raise ConnectionResetError("the client closed the connection")
            if event is None:
                if now > deadline:
                    raise OpenAIError(504, "the pipeline did not answer in time", "timeout")
                continue
            if isinstance(event, Failed):
                raise OpenAIError(event.status, event.message, "server_error" if event.status >= 500 else None)
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


def _logprobs_block(kind: str, entries: list) -> Any:
    if not entries:
        return None
    return oa.chat_logprobs(entries) if kind == "chat" else oa.completion_logprobs(entries)


def _completion(c: Coordinator, request: Request, kind: str) -> Any:
    """POST /v1/chat/completions and /v1/completions."""
    req, prompt, params = c.prepare(kind, request.json())
    gen = Generator(c, req, prompt, params)
    if req.stream:
        _stream(c, request, kind, gen)
        return None
    entries: list = []
    gen.pieces(lambda _text, lp: entries.extend(lp), gone=request.client_gone)
    logprobs = _logprobs_block(kind, entries) if _wants_logprobs(gen.req) else None
    return oa.response(kind, oa.completion_id(kind), c.model_name, gen.text, gen.finish,
                       oa.usage(len(gen.prompt), gen.completion_tokens), logprobs)


def _stream(c: Coordinator, request: Request, kind: str, gen: Generator) -> None:
    rid = oa.completion_id(kind)
    events = request.events()

    def piece(text: str, lp: list) -> None:
        logprobs = _logprobs_block(kind, lp) if _wants_logprobs(gen.req) else None
        events.send(oa.response(kind, rid, c.model_name, text, None, None, logprobs, stream=True))

    try:
        gen.pieces(piece, gone=request.client_gone)
    except OpenAIError as exc:
        if not events.started:
            raise
        request.context["status"] = exc.status
        events.send(exc.body())  # the openai client raises on an "error" event
    else:
        events.send(oa.response(kind, rid, c.model_name, "", gen.finish, None, None, stream=True))
        if gen.req.include_usage:
            body = oa.response(kind, rid, c.model_name, "", None, oa.usage(len(gen.prompt), gen.completion_tokens),
                               None, stream=True)
            body["choices"] = []
            events.send(body)
    events.send(b"[DONE]")
    events.end()


def _health_wait(query: dict[str, str]) -> tuple[float, str | None]:
    """(seconds, state) of `/health?wait=S&unless=STATE`; no wait when absent or malformed."""
    try:
        wait_s = float(query.get("wait", 0))
    except ValueError:
        return 0.0, None
    return (wait_s if math.isfinite(wait_s) and wait_s > 0 else 0.0), query.get("unless") or None


def build_app(c: Coordinator) -> App:
    """The coordinator's routes; every completion request is counted in the metrics by status."""

    def observe(request: Request, status: int) -> None:
        if request.method == "POST":
            c.metrics.count_request(request.path if request.path in ENDPOINTS else "other", status)

    routes = [
        route("GET", "/health", lambda r: c.health(*_health_wait(r.query))),
        route("GET", "/v1/models", lambda _: c.models()),
        route("POST", ROUTE_PATH, c.move_stage),
        route("GET", "/metrics", lambda _: Raw(c.metrics.render().encode(), "text/plain; version=0.0.4")),
        *(route("POST", path, lambda r, k=kind: _completion(c, r, k)) for path, kind in ENDPOINTS.items()),
    ]
    return App.of(routes, MAX_BODY, observe=observe, log_hint="see the coordinator log")


def bind_server(host: str, port: int, log: EventLogger, limits: Limits | None = None) -> Server:
    """The coordinator's HTTP listener, bound now and serving nothing yet (attach `build_app`
    before `serve_forever`; clients wait in the backlog meanwhile). Binding first keeps the
    plan's port from being taken while the tokenizer loads."""
    return Server((host, port), App.of([], 0), log, limits or Limits().with_env())
