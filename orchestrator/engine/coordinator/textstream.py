"""Decoded text -> what the client sees: stop strings, tool calls and reasoning, matched incrementally.

This is mlx-lm's own `TextStateMachine` (mlx_lm/generate.py) with the transitions
`make_text_state_machine` gives mlx_lm.server — thinking markers to "reasoning", the
family's tool-call markers to "tool" — plus every stop string as a transition that ends
the text (mlx_lm.server instead stops on the stop string's token ids and strips the text;
pipeserve stops at the text itself, as OpenAI documents). The machine is an Aho-Corasick
automaton over all markers: each new character costs amortised O(1), and at most the
longest marker's length of text is held back, so long stop strings (bounded by
openai_schema.MAX_STOP_CHARS) never make a token cost more than its own characters.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import TextStateMachine

END = None  # the state a stop string leads to: generation is over


def transitions(tokenizer: Any, stops: list[str], tools: bool, thinking: bool = True) -> dict[str, list]:
    """mlx_lm.server's transitions for this tokenizer (`make_text_state_machine`), tool markers
    only when `tools`, and each stop string ending the text from every state."""
    out: dict[str, list] = {}
    if thinking and getattr(tokenizer, "has_thinking", False):
        out.setdefault("normal", []).append((tokenizer.think_start, "reasoning"))
        out["reasoning"] = [(tokenizer.think_end, "normal")]
    response = dict(getattr(tokenizer, "response_transitions", None) or {})
    if tools and getattr(tokenizer, "has_tool_calling", False):
        targets = {dst for edges in response.values() for _, dst in edges}
        if "tool" not in targets:
            out.setdefault("normal", []).append((tokenizer.tool_call_start, "tool"))
        if "reasoning" in out:
            out["reasoning"].append((tokenizer.tool_call_start, "tool"))
        out["tool"] = [(tokenizer.tool_call_end, "normal")] if tokenizer.tool_call_end else []
    if thinking or tools:
        for marker in getattr(tokenizer, "structural_markers", None) or ():
            out.setdefault("normal", []).append((marker, "normal"))
        for state, edges in response.items():
            if tools or all(dst != "tool" for _, dst in edges):
                out.setdefault(state, []).extend(edges)
    for state in set(out) | {"normal"}:
        out.setdefault(state, []).extend((s, END) for s in stops)
    return out


class TextStream:
    """Feed decoded text; get (state, text) segments back; `stopped` once a stop string matched."""

    def __init__(self, tokenizer: Any, stops: list[str], tools: bool, initial: str = "normal",
                 thinking: bool = True) -> None:
        self._machine = TextStateMachine(transitions(tokenizer, stops, tools, thinking))
        self._state = self._machine.make_state(initial)
        self.stopped = False

    @property
    def state(self) -> str | None:
        """The current state: normal, reasoning, tool (None after a stop string)."""
        return self._state[0]

    def feed(self, text: str) -> list[tuple[str | None, str]]:
        """The segments `text` completes; text that may begin a marker is held back."""
        if self.stopped or not text:
            return []
        self._state, segments = TextStateMachine.split(self._state, text)
        if self._state[0] is END:
            self.stopped = True
        return [(s, t) for s, t in segments if t or s is not END]

    def flush(self) -> list[tuple[str | None, str]]:
        """The end of the text: whatever was held back is plain text of the current state."""
        if self.stopped:
            return []
        self._state, held, state = TextStateMachine.flush(self._state)
        return [(state, held)] if held else []


def initial_state(tokenizer: Any, prompt: list[int]) -> str:
    """Where a chat answer starts, as mlx_lm.server decides: in "reasoning" when the prompt
    opened a thinking block it did not close, or the family's response format's own start."""
    state = "normal"
    if getattr(tokenizer, "has_thinking", False):
        if tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt):
            state = "reasoning"
    return getattr(tokenizer, "response_initial_state", None) or state
