"""Grammars for constrained decoding, built and checked on the coordinator (llguidance).

`response_format` json_object / json_schema becomes llguidance's JSON-schema grammar; a
`tool_choice` of "required" or a named function becomes a Lark grammar of the family's
tool-call text (the json_tools format: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`)
whose JSON follows the tools' parameter schemas. The grammar is validated here against the
model's tokenizer, so an unsupported schema feature is a 400 naming it before anything is
queued; the last stage enforces it (engine/stage/constraint.py).

Why llguidance: it computes a token mask in tens of microseconds from the tokenizer itself
(no per-vocabulary precompilation per schema), covers JSON Schema broadly and reports the
features it does not support by name, and is the library vLLM, SGLang and llama.cpp use.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.engine.coordinator.openai_schema import ChatRequest, ResponseFormat

MAX_GRAMMAR_BYTES = 48 * 1024  # it travels in the request's OPEN frame (64 KiB of JSON at most)
# Compact JSON (", " and ": " between items, no other whitespace): flexible whitespace lets a weak
# model pad with newlines until max_tokens instead of closing the object.
COMPACT = {"whitespace_flexible": False}
JSON_TOOLS_PARSER = "mlx_lm.tool_parsers.json_tools"


class GrammarError(ValueError):
    """The request's schema or tools cannot be enforced: `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def response_grammar(fmt: ResponseFormat | None) -> str | None:
    """The llguidance grammar of a `response_format`; None for text."""
    import llguidance

    if fmt is None or fmt.type == "text":
        return None
    schema: Any = {"type": "object"} if fmt.type == "json_object" else fmt.json_schema.schema_
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT)
    except ValueError as exc:
        raise GrammarError(f"response_format.json_schema.schema: {exc}", "response_format") from None


def tool_grammar(req: ChatRequest, tokenizer: Any) -> str | None:
    """The grammar forcing a tool call when `tool_choice` is "required" or names a function."""
    import llguidance

    choice = req.tool_choice
    if choice in (None, "auto", "none"):
        return None
    tools = req.tool_defs
    if not tools:
        raise GrammarError("tool_choice: a tool must be called, but `tools` is empty", "tool_choice")
    if isinstance(choice, str):
        chosen = tools
    else:
        chosen = [t for t in tools if t.function.name == choice.name]
        if not chosen:
            raise GrammarError(f"tool_choice: no tool named {choice.name!r} in `tools`", "tool_choice")
    parser = getattr(getattr(tokenizer, "tool_parser", None), "__module__", "")
    if parser != JSON_TOOLS_PARSER:
        family = parser.rsplit(".", 1)[-1] or "none"
        raise GrammarError(f"tool_choice: forcing a call is supported for the json_tools tool-call format; this "
                           f"model's is {family!r} (use tool_choice 'auto')", "tool_choice")
    calls = {"anyOf": [{"type": "object", "properties": {
        "name": {"const": t.function.name},
        "arguments": t.function.parameters or {"type": "object"}},
        "required": ["name", "arguments"], "additionalProperties": False} for t in chosen], "x-guidance": COMPACT}
    start, end = json.dumps(tokenizer.tool_call_start), json.dumps(tokenizer.tool_call_end)
    repeat = "+" if req.parallel_tool_calls and isinstance(choice, str) else ""
    lark = f'start: call{repeat}\ncall: {start} "\\n" %json {json.dumps(calls)} "\\n" {end}\n'
    return llguidance.LLMatcher.grammar_from_lark(lark)


def check(grammar: str, lltokenizer: Any, param: str) -> None:
    """Raise GrammarError (naming `param` and llguidance's reason) unless the grammar compiles."""
    import llguidance

    if len(grammar.encode()) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"{param}: the schema compiles to {len(grammar.encode())} bytes of grammar, "
                           f"more than {MAX_GRAMMAR_BYTES}", param)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltokenizer)
    if is_error:
        raise GrammarError(f"{param}: {messages[0] if messages else 'invalid schema'}", param)
