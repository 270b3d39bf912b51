"""Stop strings are matched incrementally: a token costs the same work with 1,000-character stop
strings as with 4-character ones (issue 20 item 7: the old scan was quadratic in them).

Work is counted, not timed: the Python lines executed while the answer streams (sys.settrace).
The scheduler is the seam here — a stand-in hands the Generator a fixed token stream — so the
count covers exactly the coordinator's per-token text work: detokenizer, stop matching, pieces.
"""

from __future__ import annotations

import queue
import sys
from types import SimpleNamespace

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from orchestrator.engine.coordinator import openai_schema as oa
from orchestrator.engine.coordinator.api import Generator
from orchestrator.engine.coordinator.generation import Finished, GenerationParams, TokenEvent

TOKENS = 400


class _Scheduler:
    """Stands in for the pipeline: submit() returns a generation whose events are `tokens`."""

    def __init__(self, tokens: list[int], eos: set[int]) -> None:
        self.tokens, self.eos_ids = tokens, eos

    def submit(self, prompt: list[int], params: GenerationParams, marks: tuple[int, ...] = (),
               scope: str = "") -> SimpleNamespace:
        events: queue.Queue = queue.Queue()
        for t in self.tokens:
            events.put(TokenEvent(t, -1.0))
        events.put(Finished("length"))
        return SimpleNamespace(events=events, cancel=lambda: None, cached_tokens=0)


def _lines_executed(tokenizer, tokens: list[int], stops: list[str]) -> tuple[int, str]:
    coordinator = SimpleNamespace(tokenizer=tokenizer, pipeline=_Scheduler(tokens, set(tokenizer.eos_token_ids)),
                                  metrics=SimpleNamespace(add_prompt_tokens=lambda n: None),
                                  token_text=lambda t: tokenizer.decode([t]), cache_marks=lambda req, prompt: ())
    req = oa.CompletionRequest.model_validate({"model": "m", "prompt": "x", "stop": stops, "temperature": 0})
    gen = Generator(coordinator, req, [1], GenerationParams(max_tokens=len(tokens)))
    count = [0]

    def tracer(frame, event, arg):
        if event == "line":
            count[0] += 1
        return tracer

    sys.settrace(tracer)
    try:
        gen.pieces(lambda *_: None)
    finally:
        sys.settrace(None)
    return count[0], gen.text


def _tokens(tokenizer) -> list[int]:
    """TOKENS merged (multi-character) tokens without a "z": no stop string below can match."""
    ids = [t for t in range(259, 510) if "z" not in tokenizer.decode([t])]
    return (ids * (TOKENS // len(ids) + 1))[:TOKENS]


@pytest.fixture(scope="module")
def tokenizer(model_factory):
    return load_tokenizer(model_factory())


def test_long_stop_strings_cost_no_more_per_token(tokenizer):
    tokens = _tokens(tokenizer)
    short, text_short = _lines_executed(tokenizer, tokens, ["zqzq"] * 4)
    long, text_long = _lines_executed(tokenizer, tokens, ["z" * 1000] + ["zq" * 500] * 3)
    assert text_short == text_long and len(text_long) > 1000  # nothing matched: the whole text streamed
    # The old scan looked back over every stop string's length at each token: >1,000 lines a token.
    assert long < 1.5 * short, f"{long} lines with 1,000-character stop strings, {short} with 4-character ones"


def test_a_stop_string_still_ends_the_text(tokenizer):
    tokens = _tokens(tokenizer)
    full = _lines_executed(tokenizer, tokens, [])[1]
    stop = full[200:260]
    _, text = _lines_executed(tokenizer, tokens, ["zq" * 500, stop])
    assert text == full[:full.find(stop)]
