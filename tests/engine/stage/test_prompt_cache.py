"""The prompt cache over real stage processes: hits, exactness, concurrency, faults, accounting.

Real stages exchange real tensors over TCP; the coordinator is a `Pipeline` in the test
process (harness.InTestCoordinator) or the coordinator process behind the official `openai`
client. The reference for a hit is mlx-lm's own prompt-cache path in this process
(cache_rig), and a cold `generate_step` run for the tokens.
"""

from __future__ import annotations

import signal

import anthropic
import openai
import pytest

from orchestrator.engine.coordinator.prefix_index import PrefixIndex, Reuse, prefill_chunks, system_prompt_end
from orchestrator.proc import wait_until
from tests.support.cache_rig import CachedRig, whole
from tests.support.engine_harness import InTestCoordinator, assert_same, reference

PROMPT = [(i * 37 + 11) % 500 for i in range(60)]
TOKENS = 8


# --- the index (pure) -------------------------------------------------------------------

def _stored(index: PrefixIndex, tokens: list[int], nbytes: int = 10, trimmable: bool = True, kind: str = "assistant"):
    entry = index.add(tokens, kind)
    victims = []
    for stage in range(index.stages):
        victims += index.stored(stage, entry, nbytes, trimmable, len(tokens))
    return entry, victims


def test_the_index_plans_the_longest_usable_prefix_and_never_the_last_token():
    index = PrefixIndex(2, 1000)
    a, _ = _stored(index, [1, 2, 3, 4, 5, 6])
    assert index.plan([1, 2, 3, 9]) == Reuse(a, 3)  # a strict prefix: trimmed to the common part
    assert index.plan([1, 2, 3, 4, 5, 6]) == Reuse(a, 5)  # the whole prompt cached: its last token is computed
    assert index.plan([1, 2, 3, 4, 5, 6, 7, 8]) == Reuse(a, 6)  # the next turn
    assert index.plan([9, 1, 2]) is None and index.plan([1]) is None
    b, _ = _stored(index, [1, 2, 3, 4, 5, 6, 7, 8, 9], trimmable=False)  # a recurrent state: whole prefixes only
    assert index.plan([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == Reuse(b, 9)
    assert index.plan([1, 2, 3, 4, 5, 6, 7, 8, 0]) == Reuse(a, 6)  # b cannot be cut back to 8; a serves 6
    assert index.needs_checkpoint(9) and not index.needs_checkpoint(8)


def test_an_entry_serves_at_once_and_trims_once_the_stages_say_it_can():
    """Stages store entries in chain order, before any later OPEN: a pending entry serves a prompt it
    is a whole prefix of right away; it is cut back only once trimming is known to work."""
    index = PrefixIndex(2, 1000)
    entry = index.add([1, 2, 3, 4])
    assert index.plan([1, 2, 3, 4, 5]) == Reuse(entry, 4)
    assert index.plan([1, 2, 3, 9]) is None  # can it trim? nobody said yet
    assert index.stored(0, entry, 10, True, 4) == [] and index.plan([1, 2, 3, 9]) is None
    assert index.stored(1, entry, 10, True, 4) == []
    assert index.plan([1, 2, 3, 9]) == Reuse(entry, 3)
    other = index.add([1, 2, 3, 4, 5, 6, 7])  # pending, but this cluster's entries trim
    assert index.plan([1, 2, 3, 4, 5, 6, 0]) == Reuse(other, 6)
    assert index.stored(1, 999, 10, True, 4) == [999]  # unknown: the stage must drop it
    wrong = index.add([7, 8, 9])
    assert index.stored(0, wrong, 10, True, 2) == [wrong]  # a stage that holds another length: gone


def test_eviction_keeps_every_stage_within_budget_preferring_system_prompts():
    index = PrefixIndex(2, 100)
    system, _ = _stored(index, [1, 2, 3], nbytes=40, trimmable=False, kind="system")
    turn, _ = _stored(index, [5, 6, 7], nbytes=40)
    _, victims = _stored(index, [8, 9, 10], nbytes=40)
    assert victims == [turn]  # the oldest one-off completion goes, the system prompt stays
    assert index.stats()["bytes"] == [80, 80] and index.plan([1, 2, 3, 4]) == Reuse(system, 3)
    longer, victims = _stored(index, [8, 9, 10, 11, 12], nbytes=40)
    assert len(victims) == 1 and index.plan([8, 9, 10, 11, 12, 13]) == Reuse(longer, 5)  # its prefix was redundant
    assert index.clear() and index.plan([1, 2, 3, 4]) is None and index.stats()["bytes"] == [0, 0]
    assert PrefixIndex(2, 0).plan([1, 2, 3]) is None  # a zero budget turns the cache off


def test_prefill_chunks_follow_generate_step_and_cut_at_checkpoints():
    assert prefill_chunks(10, 0, 4) == [(0, 4, False), (4, 8, False), (8, 9, False)]
    assert prefill_chunks(10, 3, 4) == [(3, 7, False), (7, 9, False)]
    assert prefill_chunks(10, 0, 4, {6, 9, 0}) == [(0, 4, False), (4, 6, True), (6, 8, False), (8, 9, False)]


def test_the_system_prompt_end_is_found_like_mlx_lm_server():
    def render(messages):  # a toy template: role tag, content, end tag per message
        out = []
        for m in messages:
            out += [100 if m["role"] == "system" else 101, *map(ord, m["content"]), 102]
        return out

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = render(messages)
    assert system_prompt_end(render, messages, prompt) == (len("be brief") + 3,)
    assert system_prompt_end(render, messages[1:], render(messages[1:])) == ()


# --- real stages ------------------------------------------------------------------------

def _next_turn(first: list[int], answer: list[int], more: list[int]) -> list[int]:
    return first + answer[:-1] + [answer[-1], *more]


def test_a_next_turn_starts_from_the_cache_and_equals_mlx_lm(model_factory, launch):
    """Turn two reuses turn one's whole entry on both stages: bits equal mlx-lm's prompt-cache
    path, tokens equal a cold run; the stages and the index account for it."""
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=16)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        one = coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store turn one")
        second = _next_turn(PROMPT, one.tokens, [3, 1, 4, 1, 5])
        gen = coord.generate(second, TOKENS)
        two = coord.collect(gen)
        assert gen.cached_tokens == len(PROMPT) + TOKENS - 1
        rig = CachedRig(whole(model), 16)
        rig.run(PROMPT, TOKENS)
        expected, reuse = rig.run(second, TOKENS)
        assert reuse is not None and reuse.keep == gen.cached_tokens
        assert_same(expected, two)
        assert two.tokens == reference(model, second, TOKENS, prefill_step=16).tokens
        stats = coord.stage_stats(lambda s: all(x.get("prompt_cache", {}).get("hits") == 1 for x in s))
        assert all(s["prompt_cache"]["entries"] >= 1 and s["prompt_cache"]["bytes"] > 0 for s in stats)
        c = coord.pipeline.cache.stats()
        assert c["hits"] == 1 and c["tokens_saved"] == gen.cached_tokens and all(b > 0 for b in c["bytes"])
        text = coord.pipeline.metrics.render()
        assert f"pipeserve_prompt_cache_tokens_saved_total {gen.cached_tokens}" in text
    finally:
        coord.stop()


def test_requests_reusing_one_entry_at_once_each_equal_their_cold_run(model_factory, launch):
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store turn one")
        prompts = [PROMPT[:40] + [i, i + 1, i + 2] for i in (7, 70, 170)]
        gens = [coord.generate(p, TOKENS) for p in prompts]
        for p, gen in zip(prompts, gens):
            assert coord.collect(gen).tokens == reference(model, p, TOKENS).tokens
            assert gen.cached_tokens == 40
    finally:
        coord.stop()


def test_a_replaced_stage_drops_the_index_and_no_request_starts_from_stale_kv(model_factory, launch):
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        one = coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store turn one")
        cluster.kill("stage-1", signal.SIGKILL)
        assert cluster.procs["stage-1"].wait_exit(10)
        wait_until(lambda: not coord.pipeline.health.ready, 10, 0.02, "the coordinator to notice the lost stage")
        assert coord.pipeline.cache.stats()["entries"] == 0  # gone with the stage, before any replacement
        cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                                   "--model", str(model)])
        coord.wait_ready()
        second = _next_turn(PROMPT, one.tokens, [2, 7, 1, 8])
        gen = coord.generate(second, TOKENS)
        two = coord.collect(gen)
        assert two.tokens == reference(model, second, TOKENS).tokens
        assert gen.cached_tokens == 0  # cold: stage-0 still had the entry until the RESET, stage-1 never
        stats = coord.stage_stats(lambda s: all("prompt_cache" in x for x in s) and s[0]["prompt_cache"]["hits"] == 0)
        assert stats[0]["prompt_cache"]["entries"] <= 1  # the old entry was dropped (at most the new one)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the new entry")
        gen = coord.generate(_next_turn(second, two.tokens, [9]), 2)
        coord.collect(gen)
        assert gen.cached_tokens == len(second) + TOKENS - 1  # and the cache fills again
    finally:
        coord.stop()


def test_a_stage_missing_the_entry_makes_the_request_start_cold(model_factory, launch):
    """If the index ever named an entry a stage does not hold (here a stage that acknowledges
    entries it does not keep), the stage refuses it and the coordinator starts the request
    again without it: the answer is still exact, and the entry is forgotten."""
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, env={"PIPESERVE_FAULTS": "stage-1:cache-forget"})
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store turn one")
        prompt = PROMPT[:50] + [1, 2]
        gen = coord.generate(prompt, TOKENS)
        assert coord.collect(gen).tokens == reference(model, prompt, TOKENS).tokens
        assert gen.cached_tokens == 0
        assert coord.pipeline.cache.stats()["hits"] == 1  # planned, refused, started again cold
        assert "prompt cache" in cluster.output("stage-1", tail=200)
    finally:
        coord.stop()


@pytest.mark.parametrize("fault", ["cache-skip-trim", "cache-stale"])
def test_real_stages_that_reuse_stale_or_untrimmed_kv_fail_the_comparison(model_factory, launch, fault):
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, env={"PIPESERVE_FAULTS": f"stage-1:{fault}"})
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        coord.run([(i * 11 + 3) % 500 for i in range(40)], TOKENS)  # an unrelated first entry
        coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 2, 10, 0.02, "two entries")
        prompt = PROMPT[:40] + [7, 8, 9]
        gen = coord.generate(prompt, TOKENS)
        got = coord.collect(gen)
        assert gen.cached_tokens == 40
        with pytest.raises(AssertionError):
            assert_same(reference(model, prompt, TOKENS), got)
    finally:
        coord.stop()


def test_the_api_reports_cached_tokens(model_factory, launch):
    """The official clients: usage.prompt_tokens_details.cached_tokens (openai) and
    cache_read_input_tokens (anthropic) on a repeated system prompt."""
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)])
    client = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    system = {"role": "system", "content": "You answer in one short sentence. " * 8}
    first = client.chat.completions.create(model=model.name, messages=[system, {"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    def second():
        r = client.chat.completions.create(model=model.name, temperature=0, max_tokens=4,
                                           messages=[system, {"role": "user", "content": "and now?"}])
        return r if r.usage.prompt_tokens_details.cached_tokens > 0 else None

    r = wait_until(second, 10, 0.1, "a request served from the prompt cache")  # the entry is stored right after
    assert 0 < r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens
    claude = anthropic.Anthropic(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=60)
    m = claude.messages.create(model=model.name, max_tokens=4, system=system["content"],
                               messages=[{"role": "user", "content": "and now?"}])
    assert m.usage.cache_read_input_tokens > 0  # the Anthropic API reports the same reuse


def test_an_entry_is_never_cut_below_the_floor_a_stage_reported():
    """Chunked attention trims no further than its chunk's start: the stage says so when it stores."""
    index = PrefixIndex(1, 1000)
    short = index.add([1, 2, 3])
    index.stored(0, short, 10, True, 3, floor=3)  # e.g. a checkpoint
    long = index.add([1, 2, 3, 4, 5, 6, 7, 8])
    assert index.stored(0, long, 10, True, 8, floor=5) == []  # not redundant: long cannot serve 3
    assert index.plan([1, 2, 3, 4, 5, 6, 0]) == Reuse(long, 6)
    assert index.plan([1, 2, 3, 4, 0]) == Reuse(short, 3)  # long would have to be cut to 4 < 5


def test_the_health_report_carries_each_stage_prompt_cache_to_the_control_plane():
    from orchestrator.control.watcher import cache_of
    from orchestrator.engine.coordinator.health_report import HealthReport

    stage = {"id": "stage-0", "address": "127.0.0.1:1", "state": "up"}
    report = HealthReport.model_validate({"status": "ready", "ready": True, "stages": [
        {**stage, "prompt_cache": {"entries": 2, "bytes": 10, "hits": 1, "tokens_reused": 40}},
        {**stage, "id": "stage-1", "prompt_cache": "odd"}]})
    assert cache_of(report.stage("stage-0")).tokens_reused == 40
    assert report.stage("stage-1").prompt_cache is None and cache_of(None) is None  # odd words lose that part only
