"""/metrics counts a prompt-cache hit when the request starts from the entry, not when a stage next
acknowledges some entry (real stage processes; the coordinator's scheduler in the test process)."""

from __future__ import annotations

from tests.support.engine_harness import InTestCoordinator

PROMPT = [(i * 37 + 11) % 500 for i in range(24)]


def test_a_hit_is_on_metrics_as_soon_as_the_request_starts_from_the_entry(model_factory, launch):
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        answer = coord.run(PROMPT, 8).tokens
        # From here on the stages' acknowledgements of stored entries are not read: the figures on
        # /metrics may only come from the requests themselves (on a loaded machine an ack arrives late).
        coord.pipeline.prompt_cache.on_ack = lambda stage, frame: None
        turn = [*PROMPT, *answer, 3, 4]  # the next turn: starts from the entry the answer left (exact)
        coord.run(turn, 4)
        assert coord.metric("pipeserve_prompt_cache_hits_total") == 1
        assert coord.metric("pipeserve_prompt_cache_lookups_total") == 2
    finally:
        coord.stop()
