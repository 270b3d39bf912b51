"""What makes a test model tool-capable: a Qwen-style tool chat template and two tool-call tokens.

mlx-lm recognises tool calling by the chat template (`<tool_call>` and `tool_call.name` select
its `json_tools` parser, mlx_lm/tokenizer_utils.py), so a test model with this template is
parsed by mlx_lm.server and by pipeserve alike. A random model never writes a tool call by
itself; each of the two added tokens *is* one whole call (no spaces: the byte-level decoder
maps them one to one), so a request can make the model call tools deterministically with
`logit_bias` (and a `presence_penalty` to move on to the next token).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer

TOOL_CALL_TOKENS = (
    '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
    '<tool_call>{"name":"get_time","arguments":{"zone":"UTC"}}</tool_call>',
)

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- if message.content %}{{ message.content }}\n{% endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add_tool_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """Append TOOL_CALL_TOKENS as plain (not special) added tokens, in order."""
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TOKENS])
    return tokenizer
