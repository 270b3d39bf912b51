"""A validated OpenAI request -> the prompt tokens and the generation parameters (pure over the tokenizer).

Chat prompts are rendered by the model's own chat template with `tools=` (mlx_lm.server's
rendering: text content, tool-call arguments as objects). Sampling options are mlx_lm.server's
and keep its defaults; constrained decoding comes from `response_format` or a forced
`tool_choice` (engine/coordinator/structured.py). Bad input raises `BadRequest` naming the field.
"""

from __future__ import annotations

from typing import Any

from orchestrator.engine.coordinator import openai_schema as oa
from orchestrator.engine.coordinator.generation import GenerationParams
from orchestrator.engine.coordinator.structured import GrammarError, check, response_grammar, tool_grammar


class BadRequest(ValueError):
    """A request that cannot be served as sent: a 400 naming `param`."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def check_tool_history(req: oa.ChatRequest) -> None:
    """Every `tool` message answers a call an earlier assistant message made."""
    called: set[str] = set()
    for i, m in enumerate(req.messages):
        if m.role == "assistant":
            called.update(c.id for c in m.tool_calls or () if c.id)
        elif m.role == "tool":
            if not m.tool_call_id:
                raise BadRequest(f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers",
                                 f"messages[{i}].tool_call_id")
            if m.tool_call_id not in called:
                raise BadRequest(f"messages[{i}].tool_call_id: no earlier assistant tool call has id "
                                 f"{m.tool_call_id!r}", f"messages[{i}].tool_call_id")


def render_chat(tokenizer: Any, req: oa.ChatRequest) -> list[int]:
    """The chat prompt, by the model's template; tools only when the model can call them."""
    check_tool_history(req)
    tools = req.tools or None  # as the client sent them: the template prints them (mlx_lm.server's prompt)
    if tools and req.tool_choice != "none" and not getattr(tokenizer, "has_tool_calling", False):
        raise BadRequest("tools: this model's chat template has no tool calling (mlx-lm finds no tool-call "
                         "format for it), so tools cannot be used", "tools")
    try:
        messages = [m.for_template() for m in req.messages]
    except ValueError as exc:
        raise BadRequest(f"messages: {exc}", "messages") from None
    kwargs = dict(req.chat_template_kwargs or {})
    if tools and req.tool_choice != "none":
        kwargs["tools"] = tools
    try:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs))
    except Exception as exc:  # noqa: BLE001 — a template raising on this history (jinja's own exceptions): the client's input
        raise BadRequest(f"messages: the chat template cannot render them: {exc}", "messages") from None


def grammar_of(req: Any, tokenizer: Any, lltokenizer: Any) -> str | None:
    """The checked grammar constraining the answer, or None."""
    if getattr(req, "messages", None) is None:
        return None
    try:
        forced = tool_grammar(req, tokenizer)
        fmt = response_grammar(req.response_format)
        if forced and fmt:
            raise GrammarError("response_format: cannot be combined with a tool_choice that forces a call",
                               "response_format")
        grammar, param = (forced, "tool_choice") if forced else (fmt, "response_format")
        if grammar is not None:
            check(grammar, lltokenizer(), param)
        return grammar
    except GrammarError as exc:
        raise BadRequest(str(exc), exc.param) from None


def sampling(req: Any, tokenizer: Any, max_tokens: int, vocab: int, grammar: str | None) -> GenerationParams:
    """GenerationParams of a request (mlx_lm.server's options and defaults)."""
    bias = tuple(sorted((req.logit_bias or {}).items()))
    bad = next((t for t, _ in bias if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest(f"logit_bias: token id {bad} is not in 0..{vocab - 1}", "logit_bias")
    if req.top_k > vocab:
        raise BadRequest(f"top_k: at most the vocabulary size ({vocab})", "top_k")
    eos = tuple(sorted(getattr(tokenizer, "eos_token_ids", ()) or ()))
    xtc_special = tuple(tokenizer.encode("\n") + list(eos)) if req.xtc_probability else ()
    return GenerationParams(
        max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
        top_logprobs=req.alternatives, top_k=req.top_k, min_p=req.min_p, xtc_probability=req.xtc_probability,
        xtc_threshold=req.xtc_threshold, xtc_special_tokens=xtc_special, logit_bias=bias,
        repetition_penalty=req.repetition_penalty, repetition_context_size=req.repetition_context_size,
        presence_penalty=req.presence_penalty, presence_context_size=req.presence_context_size,
        frequency_penalty=req.frequency_penalty, frequency_context_size=req.frequency_context_size,
        grammar=grammar, eos_ids=eos)
