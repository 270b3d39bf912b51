"""The coordinator's HTTP API: OpenAI-compatible completions over the pipeline.

Served by pipeserve's HTTP toolkit (`orchestrator.httpkit`: bounded connections, timeouts,
bodies), one thread per connection. Each request thread tokenizes, submits to the
scheduler, then detokenizes the token events it receives, applies stop strings and writes
JSON or server-sent events. A client that disconnects cancels its generation, streaming
or not.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from pydantic import ValidationError

from orchestrator.cache_scope import SCOPE_HEADER, ScopeError, request_scope
from orchestrator.engine.coordinator import anthropic_api, responses_api
from orchestrator.engine.coordinator import openai_schema as oa
from orchestrator.engine.coordinator.generator import Generator, Piece, wants_logprobs
from orchestrator.engine.coordinator.health_report import HealthReport
from orchestrator.engine.coordinator.links import now
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.pipeline import GenerationParams, Pipeline
from orchestrator.engine.coordinator.prefix_index import system_prompt_end
from orchestrator.engine.coordinator.prepare import BadRequest, grammar_of, render_chat, sampling
from orchestrator.engine.stage.constraint import Constraints
from orchestrator.engine.stage_address import (
    ROUTE_PATH,
    SIGNATURE_HEADER,
    RouteError,
    format_address,
    sequence_at,
    verify,
)
from orchestrator.httpkit import App, OpenAIError, Raw, Request, route
from orchestrator.logs import EventLogger

MAX_BODY = 4 * 1024 * 1024
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
COUNTED = {*ENDPOINTS, *anthropic_api.PATHS, *responses_api.PATHS}  # the paths the metrics count by name
HEALTH_WAIT_MAX_S = 10.0  # a long poll of /health holds one server thread at most this long


class Coordinator:
    """Everything a request handler needs: pipeline, tokenizer, model name, metrics."""

    def __init__(self, pipeline: Pipeline, tokenizer: Any, model_name: str, metrics: Metrics, log: EventLogger,
                 secret: bytes = b"", model_dir: Path | None = None) -> None:
        self.pipeline = pipeline
        self._grammar_tokens = Constraints(model_dir, 0) if model_dir is not None else None
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.log = log
        self.secret = secret  # the cluster secret: signs the control plane's stage-address requests
        self._moves = threading.Lock()
        self._last_move = -1  # the sequence of the last stage-address move taken (routes.verify)
        # A move signed before this process started is a replay: a replacement takes none of its
        # predecessor's (issue 39). Both clocks are the LAN's, as MAX_SKEW_S already assumes.
        self._started_move = sequence_at(time.time())
        # Read once: the tokenizer builds its whole vocabulary dict to answer (40 ms for SmolLM2's
        # 49k tokens, more for the 150k of larger families), which every request once paid.
        self._vocab_size = len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else 1 << 31

    def move_stage(self, request: Request) -> tuple[int, dict]:
        """POST ROUTE_PATH: a stage restarted on another node; re-point the pipeline to it (signed)."""
        if not self.secret:
            raise OpenAIError(404, "stage moves are not enabled here", code="not_found")
        with self._moves:  # check and record the sequence together: two moves never both pass as newest
            try:
                stage, address, self._last_move = verify(self.secret, request.body_bytes(),
                                                         request.header(SIGNATURE_HEADER), time.time(),
                                                         len(self.pipeline.links), self._last_move,
                                                         self._started_move)
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
        report = HealthReport.model_validate({
            "status": h.state, "ready": h.ready, "reason": h.reason, "model": self.model_name,
            "in_flight": h.in_flight,
            "stages": [{**s.stats, "id": s.node_id, "address": s.address,
                        "state": "wedged" if s.fault else "up" if s.connected else "down", "fault": s.fault,
                        "last_seen_s": s.last_seen_s} for s in h.stages],
            "speculation": {"max_drafts": self.pipeline.speculative_tokens, **self.metrics.speculation(),
                            "refused": any(s.stats.get("speculation") is False for s in h.stages),
                            "refusal": next((s.stats["speculation_refused"] for s in h.stages
                                             if s.stats.get("speculation_refused")), None)}
            if self.pipeline.speculative_tokens else None,
            "pause": pause.report(now()) if (pause := self.pipeline.pauses.record) is not None else None,
        })
        return (200 if h.ready else 503), report.model_dump(mode="json")

    def models(self) -> tuple[int, dict]:
        """GET /v1/models: 503 until the pipeline is ready (a router reads it as warming up)."""
        h = self.pipeline.health
        if not h.ready:
            raise OpenAIError(503, f"pipeline is {h.state}: {h.reason}", "service_unavailable")
        return 200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                  "owned_by": "pipeserve"}]}

    def prepare(self, kind: str,
                body: dict) -> tuple[oa.ChatRequest | oa.CompletionRequest, list[int], GenerationParams]:
        """Validate a request and tokenize it; raises OpenAIError (4xx) on bad input."""
        try:
            req = (oa.ChatRequest if kind == "chat" else oa.CompletionRequest).model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
            raise OpenAIError(400, message, param=param) from None
        refused = oa.refused_field(req)
        if refused:
            raise OpenAIError(400, f"{refused[0]}: {refused[1]}", param=refused[0])
        if req.model != self.model_name:
            raise OpenAIError(404, f"The model '{req.model}' does not exist; this server serves '{self.model_name}'",
                              param="model", code="model_not_found")
        try:
            return self._prepare(kind, req)
        except BadRequest as exc:
            raise OpenAIError(400, str(exc), param=exc.param) from None

    def _prepare(self, kind: str, req: Any) -> tuple[Any, list[int], GenerationParams]:
        vocab = self.pipeline_vocab()
        if kind == "chat":
            prompt = render_chat(self.tokenizer, req)
        elif isinstance(req.prompt, str):
            prompt = list(self.tokenizer.encode(req.prompt))
        else:
            prompt = list(req.prompt)
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
        grammar = grammar_of(req, self.tokenizer, self._lltokenizer)
        return req, prompt, sampling(req, self.tokenizer, wanted or room, vocab, grammar)

    def prepare_grammars(self) -> str:
        """Build llguidance's view of the tokenizer now, at start: its build holds Python's lock for
        its whole length (0.2 s for SmolLM2's 49k tokens here, 5.5 s on a loaded machine), which on the
        first constrained request silenced /health long enough for the watcher to replace the
        coordinator. "" when ready, else why constrained decoding will refuse (said on first use)."""
        try:
            self._lltokenizer()
        except ValueError as exc:  # BadRequest too
            return str(exc)
        return ""

    def _lltokenizer(self) -> Any:
        """llguidance's view of the tokenizer (built by `prepare_grammars` at start; cached)."""
        if self._grammar_tokens is None:
            raise BadRequest("response_format: constrained decoding is not available on this coordinator",
                             "response_format")
        if not self._grammar_tokens.vocab:
            self._grammar_tokens.vocab = self.pipeline_vocab()
        return self._grammar_tokens.tokenizer(sorted(getattr(self.tokenizer, "eos_token_ids", ()) or ()))

    def cache_marks(self, req: Any, prompt: list[int]) -> tuple[int, ...]:
        """Where a prompt-cache checkpoint pays in this prompt: the end of a chat's system prompt."""
        if not isinstance(req, oa.ChatRequest):
            return ()
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            return system_prompt_end(lambda ms: list(self.tokenizer.apply_chat_template(ms)), messages, prompt)
        except (TemplateError, ValueError, TypeError, KeyError, AttributeError) as exc:  # a template that cannot
            # render a lone system turn: no checkpoint
            self.log.info("cache.no_marks", reason=exc)
            return ()

    def pipeline_vocab(self) -> int:
        """Vocabulary size (token ids accepted in a completions prompt)."""
        return self._vocab_size

    def token_text(self, token: int) -> str:
        """A single token as text (for logprobs)."""
        return self.tokenizer.decode([token])


def _logprobs_block(kind: str, entries: list) -> Any:
    if not entries:
        return None
    return oa.chat_logprobs(entries) if kind == "chat" else oa.completion_logprobs(entries)


def _completion(c: Coordinator, request: Request, kind: str, body: dict | None = None, events: Any = None) -> Any:
    """POST /v1/chat/completions and /v1/completions.

    Other APIs (Anthropic Messages, Responses) may run a chat body they translated through here
    (`body`) and take the streamed chunks in their own `events` sink; the Generator is left in
    `request.context["generation"]` (prompt, stop string, tool calls).
    """
    doc = request.json() if body is None else body
    req, prompt, params = c.prepare(kind, doc)
    try:  # whose prompt-cache entries it may reuse: the router's word on its caller, and its cache_salt
        scope = request_scope(request.header(SCOPE_HEADER), doc.get("cache_salt") if isinstance(doc, dict) else None)
    except ScopeError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
    gen = Generator(c, req, prompt, params, streaming=req.stream, scope=scope)
    request.context["generation"] = gen
    if req.stream:
        _stream(c, request, kind, gen, events or request.events())
        return None
    entries: list = []
    gen.pieces(lambda piece: entries.extend(piece.logprobs), gone=request.client_gone)
    logprobs = _logprobs_block(kind, entries) if wants_logprobs(gen.req) else None
    return oa.response(kind, oa.completion_id(kind), c.model_name, gen.text, gen.finish,
                       oa.usage(len(gen.prompt), gen.completion_tokens, gen.cached_tokens), logprobs,
                       tool_calls=gen.tool_calls, reasoning=gen.reasoning)


def _stream(c: Coordinator, request: Request, kind: str, gen: Generator, events: Any) -> None:
    rid = oa.completion_id(kind)

    def piece(p: Piece) -> None:
        logprobs = _logprobs_block(kind, p.logprobs) if wants_logprobs(gen.req) else None
        if p.text or p.reasoning or p.tool_calls or logprobs:
            events.send(oa.response(kind, rid, c.model_name, p.text, None, None, logprobs, stream=True,
                                    tool_calls=p.tool_calls, reasoning=p.reasoning))

    try:
        gen.pieces(piece, gone=request.client_gone, keepalive=events.keepalive)
    except OpenAIError as exc:
        if not events.started:
            raise
        request.context["status"] = exc.status
        # The stream ends with the error: no [DONE] after it, which a client reading to [DONE] would take
        # for a complete answer (the openai client raises on the "error" event either way).
        events.send(exc.body())
    else:
        events.send(oa.response(kind, rid, c.model_name, "", gen.finish, None, None, stream=True))
        if gen.req.include_usage:
            body = oa.response(kind, rid, c.model_name, "", None, oa.usage(len(gen.prompt), gen.completion_tokens,
                                                                        gen.cached_tokens), None, stream=True)
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
            c.metrics.count_request(request.path if request.path in COUNTED else "other", status)

    routes = [
        route("GET", "/health", lambda r: c.health(*_health_wait(r.query))),
        route("GET", "/v1/models", lambda _: c.models()),
        route("POST", ROUTE_PATH, c.move_stage),
        route("GET", "/metrics", lambda _: Raw(c.metrics.render().encode(), "text/plain; version=0.0.4")),
        *(route("POST", path, lambda r, k=kind: _completion(c, r, k)) for path, kind in ENDPOINTS.items()),
        *anthropic_api.routes(c, lambda r, body, events: _completion(c, r, "chat", body, events)),
        *responses_api.routes(c, lambda r, body, events: _completion(c, r, "chat", body, events)),
    ]
    return App.of(routes, MAX_BODY, observe=observe, log_hint="see the coordinator log")

