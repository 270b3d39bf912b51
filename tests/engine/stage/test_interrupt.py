"""A long step evaluated layer by layer gives the same result, and a RESET stops it between layers.

In process: a stage's forward of a prefill chunk with its layers evaluated one by one is bit for
bit the plain forward, and a step found stale after its first layer raises `Abandoned`; decode
steps whose first layers start evaluating while the rest is built are bit for bit the steps built
whole first.
With real processes: a stage paused after each layer of a long prefill (the `layer-pause` fault)
is mid-step when a new coordinator session's RESET reaches it; the stage abandons the step there
(without the checks it would compute every layer first) and the new session serves exactly.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from orchestrator.engine.stage.interrupt import INTERRUPTIBLE_TOKENS, OVERLAP_EVERY, Abandoned, overlap_for
from orchestrator.engine.stage.shard import StageModel
from orchestrator.proc import wait_until
from tests.engine.harness import InTestCoordinator, reference

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


def test_decode_steps_evaluated_while_built_are_the_steps_built_whole(model_factory, monkeypatch):
    layers = 2 * OVERLAP_EVERY
    model = model_factory(layers=layers)
    started = []
    real_async_eval = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (started.append(a), real_async_eval(*a))[1])

    def decode(overlap_every: int) -> list[bytes]:
        stage = StageModel(model, 0, layers)
        stage.checks.overlap_every = overlap_every
        cache, token, out = stage.make_cache(), PROMPT[:5], []
        for _ in range(6):
            logits = stage.forward(mx.array(token)[None], cache)
            mx.eval(logits, [c.state for c in cache])
            out.append(np.array(logits).tobytes())
            token = [int(mx.argmax(logits[0, -1]).item())]
        return out

    whole = decode(0)
    assert not started
    for every in (1, OVERLAP_EVERY):
        assert decode(every) == whole
    # each forward started evaluating after every `every` layers: 8 + 2 per step of the two runs
    assert len(started) == 6 * (layers + layers // OVERLAP_EVERY)


def test_steps_overlap_only_with_a_core_left_for_python():
    assert overlap_for(1, 2) == OVERLAP_EVERY  # a co-located stage's batched step, a node's stage on part of it
    assert overlap_for(2, 2) == 0  # a SOLO step on every core: building would take a BLAS thread's core
    assert overlap_for(8, 4) == 0


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
