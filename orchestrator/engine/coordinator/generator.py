"""One request's token events -> the pieces a client sees: text, reasoning, tool calls, log-probs.

The detokenizer is mlx-lm's streaming one; the text goes through `TextStream` (stop strings,
thinking and tool-call markers, matched incrementally) and tool-call text through the
family's own parser, exactly as mlx_lm.server does (`ToolCallFormatter`): a call is complete
when its end marker arrives, or at the end of the answer.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.engine.coordinator.generation import Failed, Finished, GenerationParams, NotReady, Paused, TokenEvent
from orchestrator.engine.coordinator.textstream import TextStream, initial_state
from orchestrator.httpkit import OpenAIError

EVENT_TIMEOUT = 600.0  # the scheduler always answers; this only guards against a bug hanging a client
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks whether its client is still there
KEEPALIVE_S = 5.0  # while paused (a lost stage being replaced), a stream says so this often: no client times out


@dataclass
class Piece:
    """What one step adds to the answer."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    logprobs: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text or self.reasoning or self.tool_calls or self.logprobs)


def wants_logprobs(req: Any) -> bool:
    """Whether the request asked for log-probs (chat: a flag; completions: a count)."""
    return bool(req.logprobs) if getattr(req, "messages", None) is not None else req.logprobs is not None


def parses_tools(req: Any, tokenizer: Any) -> bool:
    """Whether tool-call markers in the answer are tool calls (chat, the model can call tools,
    and tool_choice is not "none")."""
    return (getattr(req, "messages", None) is not None and bool(getattr(tokenizer, "has_tool_calling", False))
            and req.tool_choice != "none")


class Generator:
    """Turns a submitted generation's token events into pieces, honouring stop strings and tool calls."""

    def __init__(self, coordinator: Any, req: Any, prompt: list[int], params: GenerationParams,
                 streaming: bool = False, scope: str = "") -> None:
        self.c = coordinator
        self.req = req
        self.prompt = prompt
        self.params = params
        self.scope = scope  # its prompt-cache scope (orchestrator/cache_scope.py)
        tokenizer = coordinator.tokenizer
        self.detok = tokenizer.detokenizer
        chat = getattr(req, "messages", None) is not None
        self.tools = parses_tools(req, tokenizer)
        state = initial_state(tokenizer, prompt) if chat else "normal"
        self.stream = TextStream(tokenizer, req.stop, self.tools, state, thinking=chat)
        self._formatter = _formatter(tokenizer, req, streaming) if self.tools else None
        self._prev_state = self.stream.state
        self._tool_text = ""
        self.text = ""
        self.reasoning = ""
        self.tool_calls: list[dict] = []
        self.completion_tokens = 0
        self.cached_tokens = 0  # prompt tokens the prompt cache served (usage.prompt_tokens_details)
        self.finish: str | None = None
        self.stop_sequence: str | None = None  # the stop string that ended the text (Anthropic reports it)

    def pieces(self, on_piece: Callable[[Piece], None], gone: Callable[[], bool] | None = None,
               keepalive: Callable[[], None] | None = None) -> None:
        """Run the generation, calling on_piece(piece) as the answer grows; raises OpenAIError on
        failure, ConnectionResetError (the generation cancelled) once `gone()` says the client left.
        While the pipeline replaces a lost stage the answer pauses: `keepalive()` every KEEPALIVE_S."""
        try:
            gen = self.c.pipeline.submit(self.prompt, self.params, self.c.cache_marks(self.req, self.prompt),
                                         self.scope)
        except NotReady as exc:
            raise OpenAIError(503, str(exc), "service_unavailable") from None
        self.c.metrics.add_prompt_tokens(len(self.prompt))
        try:
            self._consume(gen, on_piece, gone, keepalive)
            self.cached_tokens = gen.cached_tokens
        finally:
            if self.finish is None or self.stream.stopped:
                gen.cancel()

    def _consume(self, gen: Any, on_piece: Callable[[Piece], None], gone: Callable[[], bool] | None,
                 keepalive: Callable[[], None] | None = None) -> None:
        logprobs = self.params.top_logprobs or wants_logprobs(self.req)
        deadline = time.monotonic() + EVENT_TIMEOUT
        next_check = time.monotonic() + DISCONNECT_POLL_S
        paused_until_token, next_keepalive = False, 0.0
        pending_lp: list = []
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
                if paused_until_token and keepalive is not None and now >= next_keepalive:
                    next_keepalive = now + KEEPALIVE_S
                    keepalive()
                continue
            if isinstance(event, Paused):  # the scheduler holds it (its own deadline bounds the wait)
                paused_until_token, next_keepalive = True, now
                deadline = now + EVENT_TIMEOUT
                continue
            paused_until_token = False
            if isinstance(event, Failed):
                raise OpenAIError(event.status, event.message, "server_error" if event.status >= 500 else None)
            if isinstance(event, TokenEvent):
                self.completion_tokens += 1
                if logprobs:
                    pending_lp.append((self.c.token_text(event.token), event.logprob,
                                       [(self.c.token_text(t), lp) for t, lp in event.top][: self.req.alternatives]))
                if event.token in self.c.pipeline.eos_ids:
                    continue  # Finished follows; the end-of-sequence token is not text
                self.detok.add_token(event.token)
                segments = self.stream.feed(self.detok.last_segment)
            else:
                assert isinstance(event, Finished)
                self.detok.finalize()
                segments = self.stream.feed(self.detok.last_segment)
                self.finish = event.reason
            if self.stream.stopped:
                self.finish = "stop"
                self.stop_sequence = self._matched_stop()
            elif self.finish:
                segments += self.stream.flush()
            piece = self._route(segments)
            piece.logprobs, pending_lp = pending_lp, []
            if self.finish:
                self._end(piece)
            if piece and (self.finish or self.stream.state != "tool"):
                on_piece(piece)
            elif piece.logprobs:  # held with the tool text: keep them for the next piece
                pending_lp = piece.logprobs
            if self.finish:
                return

    def _route(self, segments: list[tuple[str | None, str]]) -> Piece:
        """Sort segments by state (mlx_lm.server's loop): a tool call ends where the text returns to normal."""
        piece = Piece()
        for state, text in segments:
            if state == "reasoning":
                piece.reasoning += text
            elif state == "tool":
                self._tool_text += text
            elif state == "normal":
                if self._prev_state == "tool":
                    piece.tool_calls += self._format([self._tool_text])
                    self._tool_text = ""
                piece.text += text
            if state is not None:
                self._prev_state = state
        self.text += piece.text
        self.reasoning += piece.reasoning
        return piece

    def _end(self, piece: Piece) -> None:
        if self._prev_state == "tool" and self._tool_text:
            piece.tool_calls += self._format([self._tool_text])
            self._tool_text = ""
        if self.finish == "stop" and self.tool_calls:
            self.finish = "tool_calls"

    def _format(self, texts: list[str]) -> list[dict]:
        calls = self._formatter(texts) if self._formatter is not None else []
        self.tool_calls += calls
        return calls

    def _matched_stop(self) -> str | None:
        # Once per answer, not per token: which of the (at most four) stop strings it was.
        return next((s for s in self.req.stop if s in self.detok.text), None)


def _formatter(tokenizer: Any, req: Any, streaming: bool) -> Any:
    # mlx_lm.server's own formatter: the family's parser, ids, arguments as JSON text, stream indices.
    from mlx_lm.server import ToolCallFormatter

    return ToolCallFormatter(tokenizer.tool_parser, req.tools or None, streaming)
