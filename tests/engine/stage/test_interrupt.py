"""A long step evaluated layer by layer gives the same result, and a RESET stops it between layers.

In process: a stage's forward of a prefill chunk with its layers evaluated one by one is bit for
bit the plain forward, and a step found stale after its first layer raises `Abandoned`; no step
is ever evaluated asynchronously.
With real processes: a stage paused after each layer of a long prefill (the `layer-pause` fault)
is mid-step when a new coordinator session's RESET reaches it; the stage abandons the step there
(without the checks it would compute every layer first) and the new session serves exactly.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from orchestrator.engine.stage.interrupt import INTERRUPTIBLE_TOKENS, Abandoned
from orchestrator.engine.stage.shard import StageModel
from orchestrator.proc import wait_until
from tests.support.engine_harness import InTestCoordinator, reference

PROMPT = [(i * 7 + 3) % 200 for i in range(3 * INTERRUPTIBLE_TOKENS)]


def test_layer_by_layer_is_the_plain_forward_bit_for_bit(model_factory):
    model = model_factory()
    stage = StageModel(model, 0, 2)
    chunk = mx.array(PROMPT[:2 * INTERRUPTIBLE_TOKENS])[None]
    plain = stage.forward(chunk, stage.make_cache())
    mx.eval(plain)
    with stage.checks.interruptible(lambda: False):
        checked = stage.forward(chunk, stage.make_cache())
        mx.eval(checked)
    assert stage.checks.layers_done == 2
    assert np.array(plain).tobytes() == np.array(checked).tobytes()


def test_a_stale_step_stops_after_its_first_layer(model_factory):
    stage = StageModel(model_factory(), 0, 2)
    with pytest.raises(Abandoned, match="after 1 layers"):
        with stage.checks.interruptible(lambda: True):
            stage.forward(mx.array(PROMPT)[None], stage.make_cache())
    stage.forward(mx.array(PROMPT[:3])[None], stage.make_cache())  # unarmed again: no check, no raise
    assert stage.checks.layers_done == 1


def test_a_stage_never_evaluates_asynchronously(model_factory, monkeypatch):
    # mx.async_eval every few layers once left stages blocked for good inside mlx at start on a loaded
    # machine (interrupt.py): decode steps and prefill chunks are evaluated whole or layer by layer
    layers = 8
    stage = StageModel(model_factory(layers=layers), 0, layers)
    started = []
    monkeypatch.setattr(mx, "async_eval", lambda *a: started.append(a))
    cache, token = stage.make_cache(), PROMPT[:5]
    for _ in range(4):
        logits = stage.forward(mx.array(token)[None], cache)
        mx.eval(logits, [c.state for c in cache])
        token = [int(mx.argmax(logits[0, -1]).item())]
    assert started == []


def test_a_reset_stops_a_long_prefill_between_layers(launch, model_factory):
    model = model_factory(layers=6)
    cluster = launch(model, [(0, 2), (3, 5)], coordinator=False, prefill_step_size=len(PROMPT),
                     env={"PIPESERVE_FAULTS": "stage-0:layer-pause"})
    first = InTestCoordinator(cluster)
    first.wait_ready()  # the probe's chunks are short: no pause
    first.generate(PROMPT, 4)  # one chunk of len(PROMPT) - 1 tokens: stage-0 pauses after each of its 3 layers
    first.stage_stats(lambda s: (s[0].get("progress") or {}).get("chunk") is not None)  # stage-0 is in it
    first.stop()
    second = InTestCoordinator(cluster)  # its link comes up with a RESET, which overtakes the step
    try:
        second.wait_ready()
        wait_until(lambda: "step.abandoned" in cluster.output("stage-0", tail=400), 30, 0.1,
                   "stage-0 to abandon its step")
        assert second.run(PROMPT[:8], 6).tokens == reference(model, PROMPT[:8], 6).tokens
    finally:
        second.stop()
    assert "step.abandoned" in cluster.output("stage-0", tail=400)
