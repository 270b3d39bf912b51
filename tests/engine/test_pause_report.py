"""The coordinator's record of a pause (`/health`'s `pause`): what became of the answers held across a lost
stage, as the control plane reads it for a recovery's timeline step and the Faults tab (issue 37).

Real processes over TCP: a stage is killed (`kill -9`) while answers stream and started again on its
address, as tests/engine/test_resume.py does; the record must count what really happened.
"""

from __future__ import annotations

import json
import signal
import threading

import pytest
import requests

from orchestrator.engine.coordinator.pauses import Pauses
from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import wait_until

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]


@pytest.fixture
def slow_model(model_factory):
    """Wide enough that an answer of 48 tokens takes long enough to be interrupted."""
    return model_factory(layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)


def stream(cluster: LocalPipeline, model: str, chunks: list[int], errors: list[str], max_tokens: int = 48) -> None:
    """One streamed greedy completion; counts its chunks into `chunks[0]` and keeps any error event."""
    request = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with requests.post(cluster.base_url + "/v1/completions", json=request, stream=True, timeout=180) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                event = json.loads(line[6:])
                if "error" in event:
                    errors.append(event["error"]["message"])
                chunks[0] += 1


def pause(cluster: LocalPipeline) -> dict | None:
    return requests.get(cluster.base_url + "/health", timeout=5).json().get("pause")


def test_two_answers_held_and_resumed_are_counted_with_the_pause_s_times(slow_model, launch):
    cluster = launch(slow_model, [(0, 1), (2, 3)])
    assert pause(cluster) is None  # nothing was ever held
    chunks, errors = [0], []
    clients = [threading.Thread(target=stream, args=(cluster, slow_model.name, chunks, errors)) for _ in range(2)]
    for c in clients:
        c.start()
    wait_until(lambda: chunks[0] >= 8, 120, 0.005, "both answers streaming")
    cluster.kill("stage-1", signal.SIGKILL)
    cluster.respawn("stage-1")
    for c in clients:
        c.join(180)
    assert not errors
    p = wait_until(lambda: (x := pause(cluster)) and x["settled"] and x, 60, 0.1, "the pause settled")
    assert (p["held"], p["resumed"], p["lost"]) == (2, 2, 0)
    assert 0 < p["ready_s"] <= p["seconds"] <= p["age_s"]


def test_an_answer_whose_stage_never_returns_is_counted_lost(slow_model, launch):
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_RESUME_DEADLINE_S": "2"})
    chunks, errors = [0], []
    client = threading.Thread(target=stream, args=(cluster, slow_model.name, chunks, errors))
    client.start()
    wait_until(lambda: chunks[0] >= 4, 120, 0.005, "the answer streaming")
    cluster.kill("stage-1", signal.SIGKILL)
    client.join(60)
    assert errors and "not resumed within 2 s" in errors[0]
    p = pause(cluster)
    assert (p["held"], p["resumed"], p["lost"], p["settled"], p["ready_s"]) == (1, 0, 1, True, None)


def test_a_pause_counts_each_answer_once_and_a_new_one_starts_after_it_settled():
    """The bookkeeping alone (no process): held again while resuming is one answer; a hold after the
    pause settled is a new pause with a new id; a stranger's end changes nothing."""
    pauses, a, b = Pauses(), object(), object()
    pauses.held(a, 10.0)
    pauses.held(b, 10.0)
    pauses.resuming(12.0)
    pauses.held(a, 13.0)  # its stage lost again while it caught up: the same pause
    pauses.resumed(b, 14.0)
    pauses.lost(object(), 14.5)
    assert pauses.record is not None and pauses.record.settled_at is None
    pauses.resuming(15.0)
    pauses.resumed(a, 16.0)
    first = pauses.record
    assert first.report(20.0) == {"id": first.id, "age_s": 10.0, "held": 2, "resumed": 2, "lost": 0,
                                  "settled": True, "ready_s": 2.0, "seconds": 6.0}
    pauses.held(a, 30.0)
    pauses.lost(a, 31.0)
    second = pauses.record
    assert second.id != first.id and (second.held, second.resumed, second.lost) == (1, 0, 1)
