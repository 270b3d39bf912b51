"""Nothing lost when a stage dies: an answer in flight pauses and resumes exactly (real processes over TCP).

A stage is killed (`kill -9`) at a chosen moment of an answer — in its prefill, early in its decode,
in the middle — and started again on its address, as the control plane or an operator does. The
coordinator holds the request, and once the pipeline is ready again regenerates what the client
already has (checked token by token) and goes on: the client sees a pause, then the rest.
Every answer is compared field by field with its undisturbed run: text, token log-probs, finish
reason and token counts. The comparison bites: a resume that repeats a token, drops one, or restarts
the sampler fails it (coordinator fault hooks `resume-repeat`, `resume-drop`, `resume-reseed`).
"""

from __future__ import annotations

import json
import signal

import pytest
import requests

from tests.support.resume import Killer, answer, chat_answer, held_tokens, ready

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]


@pytest.fixture
def slow_model(model_factory):
    """Wide enough that an answer of 48 tokens takes long enough to be interrupted."""
    return model_factory(layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)


def body(model: str, stream: bool, seeded: bool, prompt: list[int] = PROMPT) -> dict:
    sampling = {"temperature": 0.9, "seed": 7} if seeded else {"temperature": 0}
    tokens = 48 if stream else 120  # a non-streamed answer must still be running when it is seen in flight
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "logprobs": 1, "stream": stream, **sampling}


@pytest.mark.parametrize("stage, at, stream, seeded", [
    ("stage-1", 12, True, False),   # the last stage, mid-decode, greedy, streamed
    ("stage-0", 3, True, True),     # the first stage, early decode, seeded sampling, streamed
    ("stage-1", 0, False, True),    # the last stage while a non-streamed answer runs, seeded
])
def test_an_answer_resumes_exactly_after_a_stage_is_killed(slow_model, launch, stage, at, stream, seeded):
    cluster = launch(slow_model, [(0, 1), (2, 3)])
    request = body(slow_model.name, stream, seeded)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, stage, at)
    assert answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1


def test_an_answer_killed_in_its_prefill_resumes_exactly(slow_model, launch):
    """Stage 0 pauses after each layer of a long prefill chunk (the `layer-pause` fault), so the kill
    of the last stage, as soon as the request is in flight, lands in its prefill: held with nothing sent."""
    # No prompt cache: the second run must prefill its prompt again, not start from the first run's entry
    # (once the stages' acknowledgement beat the second request, it skipped the prefill the kill waits for)
    cluster = launch(slow_model, [(0, 1), (2, 3)], prefill_step_size=16, prompt_cache_bytes=0,
                     env={"PIPESERVE_FAULTS": "stage-0:layer-pause"})
    request = body(slow_model.name, True, False, prompt=PROMPT)  # chunks of 16, 16, 7: the first two 1 s each
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1").in_flight()
    assert answer(cluster, request) == undisturbed
    assert kill.resumed() == 1
    assert held_tokens(cluster) == [0]


@pytest.mark.parametrize("fault", ["resume-repeat", "resume-drop", "resume-reseed"])
def test_the_comparison_bites(slow_model, launch, fault):
    """A resume that repeats a token, drops one, or restarts the sampler must not pass as exact."""
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_FAULTS": f"coordinator:{fault}"})
    request = body(slow_model.name, True, True)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1", 10)
    try:
        resumed = answer(cluster, request, kill)
    except AssertionError:  # an error event instead of the rest: the resume refused to go on inexactly
        kill.resumed()
        return
    kill.resumed()
    assert resumed != undisturbed


def test_with_no_resume_deadline_the_answer_fails_as_before(slow_model, launch):
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_RESUME_DEADLINE_S": "0"})
    request = body(slow_model.name, True, False)
    kill = Killer(cluster, "stage-1", 5)
    with pytest.raises(AssertionError, match="error"):
        answer(cluster, request, kill)
    assert kill.resumed() == 0
    ready(cluster)


@pytest.mark.parametrize("family", ["gemma3_text", "falcon_h1", "qwen3_moe"])
def test_every_kind_of_cache_resumes_exactly(family_model, launch, family):
    """A sliding-window family (past its window), a hybrid of attention and SSM states, an MoE family:
    what the stages rebuild on a resume is their own caches' state, whatever it is."""
    model = family_model(family)
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    cluster = launch(model, [(0, layers // 2 - 1), (layers // 2, layers - 1)])
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    # end-of-sequence banned: a tiny random model may otherwise stop before the kill lands (nothing to resume)
    request = {**body(model.name, True, False, prompt=PROMPT[:12]), "max_tokens": 300,
               "logit_bias": {str(t): -100 for t in (eos if isinstance(eos, list) else [eos])}}
    undisturbed = answer(cluster, request)
    assert undisturbed["usage"] == 300
    kill = Killer(cluster, "stage-1", 2)
    assert answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1  # it was killed before the answer was done


def test_a_json_schema_answer_resumes_inside_its_grammar(model_factory, launch):
    """The grammar's state is rebuilt by the same tokens: the resumed answer is the same valid JSON."""
    model = model_factory(tools=True, layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)
    cluster = launch(model, [(0, 1), (2, 3)])
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "population"],
              "properties": {"name": {"type": "string", "maxLength": 40}, "population": {"type": "integer"}}}
    request = {"model": model.name, "messages": [{"role": "user", "content": "A city as JSON"}], "max_tokens": 120,
               "temperature": 0, "response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "city", "schema": schema}}}
    undisturbed = chat_answer(cluster, request)
    json.loads(undisturbed["content"])  # valid JSON, as the grammar forces
    kill = Killer(cluster, "stage-1", 3)
    assert chat_answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1


def test_a_speculating_answer_resumes_with_the_same_tokens(slow_model, launch):
    """A request that drafts (prompt lookup) is killed between verification passes or inside one: it
    resumes with plain decode steps, and its tokens are the ones speculation gives (speculation's own
    promise is tokens, not log-probs bit for bit: docs/speculation.md)."""
    cluster = launch(slow_model, [(0, 1), (2, 3)], speculative_tokens=4)
    request = body(slow_model.name, True, False, prompt=PROMPT * 2)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1", 8)
    resumed = answer(cluster, request, kill)
    assert kill.resumed() == 1
    same = ("text", "tokens", "finish", "usage")
    assert {k: resumed[k] for k in same} == {k: undisturbed[k] for k in same}


def test_an_answer_held_past_the_resume_deadline_ends_with_a_clear_error(slow_model, launch):
    """Its stage never comes back: the held answer waits the deadline, then ends with an error event
    saying why, and its slot is free again."""
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_RESUME_DEADLINE_S": "2"})
    request = body(slow_model.name, True, False)

    def kill_for_good(n: int) -> None:
        if n == 5:
            cluster.kill("stage-1", signal.SIGKILL)

    with pytest.raises(AssertionError, match="not resumed within 2 s"):
        answer(cluster, request, kill_for_good)
    metrics = requests.get(cluster.base_url + "/metrics", timeout=5).text
    assert "pipeserve_requests_resume_failed_total 1" in metrics and "pipeserve_requests_in_flight 0" in metrics


def test_a_lone_answer_on_all_cores_resumes_exactly(slow_model, launch):
    """Co-located stages as the local agents start them (one BLAS thread, every core for a lone
    request's SOLO steps): the answer's first run decoded on all cores and its regeneration, pipelined
    through both stages, on one thread each; Debian's OpenBLAS rounds some products differently on
    1 and 2 threads, so this is where a resume could alter the last bits of its log-probs."""
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_SOLO_THREADS": "2"})
    request = body(slow_model.name, True, False)
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1", 20)
    assert answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1
