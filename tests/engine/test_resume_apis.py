"""Every API resumes exactly across a killed stage, read by the official clients (real processes over TCP).

What tests/engine/test_resume.py proves for /v1/completions, here for /v1/chat/completions (the
`openai` client), /v1/messages (the `anthropic` client) and /v1/responses (the `openai` client),
streamed and not, greedy and seeded: a stage is killed (`kill -9`) in the middle of the answer and
started again on its address, and the answer is compared field by field with its undisturbed run —
text, tool calls (name and arguments: a call's id is a fresh uuid in every run), finish or stop
reason, log-probs where the API gives them (chat) and usage. Also: a forced tool call killed inside
the call, the middle stage of three, DeepSeek-V4.1's grouped state (mid-decode and in a prefill),
a stream through a real `pipeserve router` that waits out the pause (not cut, not retried), and
with holding off every stream of every API ending with an error event, nothing left running.

Every kill is triggered by the answer's progress (`tests/support/resume.py`), never by a delay.
"""

from __future__ import annotations

import threading

import anthropic
import openai
import pytest

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.agents import gone
from tests.support.resume import Killer, Stream, answer, ended_with_an_error, held_tokens, in_flight, resumed
from tests.support.router import served_requests, served_since, write_yaml
from tests.support.tool_requests import ASK, BOUNDED_TOOLS

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."}]
TOKENS = 64  # long enough that a kill after KILL_AT tokens lands mid-answer
KILL_AT = 6


@pytest.fixture
def chat_model(model_factory):
    """A chat (and tool-calling) template, wide enough that an answer takes a while to generate."""
    return model_factory(tools=True, layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)


def sampling(seeded: bool) -> dict:
    """Greedy, or sampled with a fixed seed (a pipeserve extension for Messages and Responses)."""
    return {"temperature": 0.9, "extra_body": {"seed": 7}} if seeded else {"temperature": 0}


# --- one answer per API, as its official client gives it, in comparable fields ---------------------------

def chat(cluster: LocalPipeline, model: str, stream: bool, seeded: bool, **extra: object) -> dict:
    """/v1/chat/completions with the openai client: content, tool calls, finish reason, log-probs, usage."""
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    kwargs = {"model": model, "messages": STORY, "max_tokens": TOKENS, "logprobs": True, "top_logprobs": 2,
              **sampling(seeded), **extra}
    out: dict = {"content": "", "calls": {}, "finish": None, "logprobs": [], "usage": None}

    def add_logprobs(lp) -> None:
        if lp is not None and lp.content:
            out["logprobs"] += [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
                                for t in lp.content]

    if not stream:
        r = client.chat.completions.create(**kwargs)
        c = r.choices[0]
        out.update(content=c.message.content or "", finish=c.finish_reason,
                   usage=(r.usage.prompt_tokens, r.usage.completion_tokens),
                   calls={i: (t.function.name, t.function.arguments) for i, t in enumerate(c.message.tool_calls or [])})
        add_logprobs(c.logprobs)
        return out
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.usage is not None:
            out["usage"] = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for c in chunk.choices:
            out["content"] += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                name, args = out["calls"].get(t.index, ("", ""))
                out["calls"][t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
            add_logprobs(c.logprobs)
            out["finish"] = c.finish_reason or out["finish"]
    return out


def messages(cluster: LocalPipeline, model: str, stream: bool, seeded: bool) -> dict:
    """/v1/messages with the anthropic client: text, tool uses, stop reason, usage (it has no log-probs)."""
    client = anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=180)
    # (this client takes no `temperature`: it goes in the body as the seed does)
    kwargs = {"model": model, "messages": STORY, "max_tokens": TOKENS,
              "extra_body": {"temperature": 0.9, "seed": 7} if seeded else {"temperature": 0}}
    if stream:
        with client.messages.stream(**kwargs) as s:
            pieces = "".join(s.text_stream)
            m = s.get_final_message()
    else:
        m = client.messages.create(**kwargs)
        pieces = None
    text = "".join(b.text for b in m.content if b.type == "text")
    assert pieces is None or pieces == text  # the deltas are the final text: nothing repeated, nothing dropped
    return {"text": text, "calls": [(b.name, b.input) for b in m.content if b.type == "tool_use"],
            "stop": (m.stop_reason, m.stop_sequence),
            "usage": (m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0), m.usage.output_tokens)}


def responses(cluster: LocalPipeline, model: str, stream: bool, seeded: bool) -> dict:
    """/v1/responses with the openai client: text, function calls, status, usage (it has no log-probs)."""
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=180)
    kwargs = {"model": model, "input": STORY, "max_output_tokens": TOKENS, **sampling(seeded)}
    if stream:  # (not `responses.stream`: its final response must be `completed`, and this one is `incomplete`)
        events = list(client.responses.create(stream=True, **kwargs))
        pieces = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        r = events[-1].response
        assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    else:
        r = client.responses.create(**kwargs)
        pieces = None
    assert pieces is None or pieces == r.output_text
    return {"text": r.output_text, "calls": [(i.name, i.arguments) for i in r.output if i.type == "function_call"],
            "status": (r.status, r.incomplete_details.reason if r.incomplete_details else None),
            "usage": (r.usage.input_tokens, r.usage.output_tokens)}


API = {"chat": chat, "messages": messages, "responses": responses}


@pytest.mark.parametrize("api, stream, seeded, stage", [
    ("chat", True, False, "stage-1"),
    ("chat", False, True, "stage-0"),
    ("chat", True, True, "stage-0"),
    ("chat", False, False, "stage-1"),
    ("messages", True, True, "stage-1"),
    ("messages", False, False, "stage-0"),
    ("responses", True, False, "stage-0"),
    ("responses", False, True, "stage-1"),
])
def test_every_api_resumes_exactly(chat_model, launch, api, stream, seeded, stage):
    cluster = launch(chat_model, [(0, 1), (2, 3)])
    ask = API[api]
    undisturbed = ask(cluster, chat_model.name, stream, seeded)
    kill = Killer(cluster, stage).after_tokens(KILL_AT)
    assert ask(cluster, chat_model.name, stream, seeded) == undisturbed
    assert kill.resumed() == 1  # held mid-answer, then resumed


@pytest.mark.parametrize("stream, seeded", [(True, False), (False, True)])
def test_a_tool_call_killed_inside_the_call_resumes_exactly(chat_model, launch, stream, seeded):
    """A forced call (tool_choice "required": the grammar makes the whole answer one call, token by token):
    the stage dies while the call's text is half written; the same call comes out, with the same log-probs."""
    cluster = launch(chat_model, [(0, 1), (2, 3)])
    forced = {"messages": ASK, "tools": BOUNDED_TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
              "max_tokens": 80}
    undisturbed = chat(cluster, chat_model.name, stream, seeded, **forced)
    assert undisturbed["finish"] == "tool_calls" and len(undisturbed["calls"]) == 1, undisturbed
    assert undisturbed["usage"][1] > KILL_AT + 4  # the kill lands inside the call, not at its end
    kill = Killer(cluster, "stage-1").after_tokens(KILL_AT)
    assert chat(cluster, chat_model.name, stream, seeded, **forced) == undisturbed
    assert kill.resumed() == 1


def test_the_middle_stage_of_three_killed_mid_answer(chat_model, launch):
    cluster = launch(chat_model, [(0, 1), (2, 2), (3, 3)])
    undisturbed = chat(cluster, chat_model.name, True, True)
    kill = Killer(cluster, "stage-1").after_tokens(KILL_AT)
    assert chat(cluster, chat_model.name, True, True) == undisturbed
    assert kill.resumed() == 1


PROMPT = [(i * 37 + 11) % 500 for i in range(40)]


def completion(model: str, max_tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "logprobs": 1, "stream": True,
            "temperature": 0}


def test_deepseek_v41_resumes_exactly_mid_decode(family_model, launch):
    """Compressed K/V in groups of 4 and a sliding window of 8 (its caches' grouped state), rebuilt from the
    same tokens: the answer, past several groups, is the same bit for bit."""
    model = family_model("deepseek_v41")
    cluster = launch(model, [(0, 2), (3, 5)])
    request = completion(model.name, 48)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1", 13)
    assert answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1


def test_deepseek_v41_resumes_exactly_from_the_middle_of_its_prefill(family_model, launch):
    """Stage 0 pauses after each layer of a long prefill chunk (the `layer-pause` fault): the last stage,
    killed as soon as the request is in flight, dies in the prefill (held with nothing sent)."""
    model = family_model("deepseek_v41")
    # no prompt cache: the second run prefills again (test_resume.py's prefill case says why)
    cluster = launch(model, [(0, 2), (3, 5)], prefill_step_size=16, prompt_cache_bytes=0,
                     env={"PIPESERVE_FAULTS": "stage-0:layer-pause"})
    request = completion(model.name, 24)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1").in_flight()
    assert answer(cluster, request) == undisturbed
    assert kill.resumed() == 1
    assert held_tokens(cluster) == [0]


# --- through the router, and with holding off ------------------------------------------------------------

def chat_stream(url: str, model: str) -> Stream:
    return Stream().read(url + "/v1/chat/completions", {
        "model": model, "messages": STORY, "max_tokens": TOKENS, "temperature": 0, "logprobs": True,
        "stream": True, "stream_options": {"include_usage": True}})


def test_a_stream_through_the_router_waits_out_the_pause(chat_model, launch, start_router, tmp_path):
    """The router keeps relaying a stream whose coordinator holds it, even after its health checks judged
    that backend down: the keep-alive comments come through, the answer ends with [DONE], equal to its
    undisturbed run, and it was asked of the coordinator once (the router did not retry it)."""
    cluster = launch(chat_model, [(0, 1), (2, 3)])
    cfg = write_yaml(tmp_path / "router.yaml", {
        "backends": [], "health_checks": {"enabled": True, "interval": "0.5s", "timeout": "2s",
                                          "unhealthy_threshold": 3, "healthy_threshold": 1,
                                          "endpoint": "/v1/models"}})
    ConfigFileRegistrar(cfg).register("pipeline", cluster.base_url, [chat_model.name])
    router = start_router(cfg)

    def routable() -> bool:
        return bool((b := router.backend("pipeline")) and b["routable"])

    wait_until(routable, 30, 0.1, "the router routing to the pipeline")
    undisturbed = chat_stream(router.url, chat_model.name)
    asked = served_requests(cluster.base_url)
    live = Stream()

    def paused_long_enough() -> None:
        """The pause lasts until the router judged the backend down and a keep-alive came through it."""
        wait_until(lambda: not routable(), 60, 0.1, "the router judging the paused backend down")
        assert live.commented.wait(60), "no keep-alive comment came through the router"

    kill = Killer(cluster, "stage-1", before_respawn=paused_long_enough).after_tokens(KILL_AT)
    live.read(router.url + "/v1/chat/completions", {
        "model": chat_model.name, "messages": STORY, "max_tokens": TOKENS, "temperature": 0, "logprobs": True,
        "stream": True, "stream_options": {"include_usage": True}})
    assert kill.resumed() == 1
    assert live.names()[-1] == "[DONE]" and live.comments >= 1
    assert strip_ids(live) == strip_ids(undisturbed)
    assert served_since([cluster.base_url], [asked], 1) == [1]


def strip_ids(stream: Stream) -> list:
    """A chat stream's events without what differs between two runs of one answer: ids (the chunks', a tool
    call's fresh uuid) and creation times."""
    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("id", "created")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return [strip(data) for _, data in stream.events]


@pytest.mark.parametrize("how", ["holding off", "torn down while held"])
def test_with_restarts_off_every_stream_ends_with_an_error_and_nothing_is_left(chat_model, launch, how):
    """Four streams — completions, chat, messages, responses — under a stage that is killed. With holding off
    (a resume deadline of 0) they fail at once; held, they end when the cluster is torn down as restarts off
    do (every process stopped, the coordinator first). Either way each ends with its API's error event and
    no sign of completion ([DONE], message_stop, response.completed), and no engine process is left."""
    cluster = launch(chat_model, [(0, 1), (2, 3)],
                     env={"PIPESERVE_RESUME_DEADLINE_S": "0"} if how == "holding off" else {})
    model, long = chat_model.name, 400  # long enough that every stream is still running at the kill
    bodies = {
        "/v1/completions": {"model": model, "prompt": "Once upon a time", "max_tokens": long, "stream": True},
        "/v1/chat/completions": {"model": model, "messages": STORY, "max_tokens": long, "stream": True},
        "/v1/messages": {"model": model, "messages": STORY, "max_tokens": long, "stream": True},
        "/v1/responses": {"model": model, "input": STORY, "max_output_tokens": long, "stream": True},
    }
    streams = {path: Stream() for path in bodies}
    readers = [threading.Thread(target=streams[p].read, args=(cluster.base_url + p, {**b, "temperature": 0}),
                                daemon=True) for p, b in bodies.items()]
    for t in readers:
        t.start()
    assert all(s.first.wait(60) for s in streams.values()), "a stream never started"
    wait_until(lambda: in_flight(cluster.base_url) == len(bodies), 30, 0.01, "every stream generating")
    cluster.kill("stage-1")
    pids = [p.pid for p in cluster.procs.values()]
    if how == "torn down while held":
        wait_until(lambda: len(held_tokens(cluster)) == len(bodies), 30, 0.05, "every answer held")
        assert not any(s.ended.is_set() for s in streams.values())  # held: waiting, not ended
        cluster.stop()
    for t in readers:
        t.join(60)
    for path, s in streams.items():
        assert s.ended.is_set() and ended_with_an_error(s), (path, s.events[-1:])
    if how == "holding off":
        assert resumed(cluster.base_url) == 0
    cluster.stop()
    assert all(gone(pid) for pid in pids), [(n, p.pid) for n, p in cluster.procs.items() if not gone(p.pid)]
