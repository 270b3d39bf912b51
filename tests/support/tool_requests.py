"""Requests that make the tool test model (`pipeserve make-test-model --tools`) call its tools:
shared by the differential test against mlx_lm.server and the structured-output tests.

Its two tool-call tokens, pushed with `logit_bias` and moved past with a `presence_penalty`, make
any server of it produce tool calls, so tool parsing is compared on real output.
"""

from __future__ import annotations

import json

WEATHER, TIME = 510, 511  # the tool-call tokens' ids (vocab 512: the last two)
EOS = 2  # <|im_end|>
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]
# The tools with bounded strings and no extra arguments, for a forced call (tool_choice "required"): a random
# model, once inside a string, rarely closes it by itself, and adds keys while it may.
BOUNDED_TOOLS = json.loads(json.dumps(TOOLS).replace('{"type": "string"}', '{"type": "string", "maxLength": 8}')
                           .replace('"type": "object",', '"type": "object", "additionalProperties": false,'))
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# One call: the weather token first, then (penalised once it is in the last two tokens) end of sequence.
ONE_CALL = {"logit_bias": {str(WEATHER): 200, str(EOS): 100}, "presence_penalty": 150.0, "presence_context_size": 2}
# Two calls in one answer: weather, time, end.
TWO_CALLS = {"logit_bias": {str(WEATHER): 200, str(TIME): 150, str(EOS): 100}, "presence_penalty": 120.0,
             "presence_context_size": 2}
HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]
