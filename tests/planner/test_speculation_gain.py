"""What the plan preview predicts speculative decoding gains (planner/speculation_gain.py, predict.py)."""

from __future__ import annotations

import pytest

from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.predict import COORDINATOR_MS, StageSpec, pass_ms, predict, stepwise_step_ms, verify_step_ms
from orchestrator.planner.speculation_gain import MEASURED, Workload, gains

# 1 ms per layer for one row, 2 ms for 8 rows (1 + (rows - 1) / 7 in between); no head.
T = LayerTiming(layer_ms_b1_solo=1.0, layer_ms_b1=1.0, layer_ms_bB=2.0, batch=8, prefill_ms_per_token=0.1)
FREE = LinkCost(rtt_ms=0.0, bandwidth_Bps=1e15)
GBE = LinkCost(rtt_ms=0.3, bandwidth_Bps=125e6)
HIDDEN = 2304


def _stages() -> list[StageSpec]:
    return [StageSpec(label="s0", node_name="a", layer_weight=10, last=False, timing=T),
            StageSpec(label="s1", node_name="b", layer_weight=10, last=True, timing=T)]


def test_a_pass_of_d_drafts_costs_a_step_of_d_plus_one_rows_on_every_stage():
    stages = _stages()
    assert verify_step_ms(stages[0], 5) == pytest.approx(10 * (1 + 4 / 7))
    # hand-checked: both stages at 5 rows, nothing on the free links, the coordinator's work
    assert pass_ms([verify_step_ms(s, 5) for s in stages], [FREE, FREE], HIDDEN, 5, COORDINATOR_MS) == \
        pytest.approx(20 * (1 + 4 / 7) + COORDINATOR_MS)
    # over 1 GbE five hidden states cross the boundary and five results come back
    over_gbe = pass_ms([verify_step_ms(s, 5) for s in stages], [GBE, GBE], HIDDEN, 5, COORDINATOR_MS)
    assert over_gbe == pytest.approx(20 * (1 + 4 / 7) + COORDINATOR_MS + 0.3 + (5 * HIDDEN + 36) / 125e3
                                     + (5 * 64) / 125e3)


def test_the_gain_is_tokens_per_pass_times_a_plain_token_over_the_pass():
    plain = 20.3
    passes = {d: 20 * (1 + d / 7) + 0.3 for d in range(1, 5)}
    every = Workload(name="repeats", drafts_per_pass=4, acceptance=1.0)
    never = Workload(name="novel", drafts_per_pass=4, acceptance=0.0)
    good, bad = gains(plain, passes, 4, [every, never])
    assert good.tokens_per_pass == 5 and good.gain == pytest.approx(5 * plain / passes[4])
    assert bad.tokens_per_pass == 1 and bad.gain == pytest.approx(plain / passes[4]) and bad.gain < 1
    # the cluster's draft limit caps what a workload drafts
    capped, = gains(plain, passes, 2, [every])
    assert capped.tokens_per_pass == 3 and capped.gain == pytest.approx(3 * plain / passes[2])
    # an average between two lengths: its tokens, and a pass priced between theirs
    half, = gains(plain, passes, 4, [Workload(name="some", drafts_per_pass=2.5, acceptance=0.5)])
    assert half.tokens_per_pass == pytest.approx(2.25)
    assert half.gain == pytest.approx(2.25 * plain / ((passes[2] + passes[3]) / 2))


def test_the_prediction_carries_the_gain_per_measured_workload_only_when_speculating():
    stages = _stages()
    assert predict(stages, [FREE, FREE], HIDDEN).speculation == ()
    perf = predict(stages, [FREE, FREE], HIDDEN, speculative_tokens=4)
    assert [g.workload for g in perf.speculation] == [w.name for w in MEASURED]
    for g, w in zip(perf.speculation, MEASURED):
        d = max(1.0, min(4.0, w.drafts_per_pass))
        assert g.tokens_per_pass == pytest.approx(1 + w.acceptance * d)
        # the pass priced as a step of d + 1 rows (the layer timing is linear in rows between 1 and 8)
        assert g.gain == pytest.approx(g.tokens_per_pass * perf.ms_per_token_1 / (20 * (1 + d / 7) + COORDINATOR_MS))
        assert g.decode_tps == pytest.approx(g.gain * perf.decode_tps_1)


def test_a_family_that_replays_pays_for_the_replay_of_each_partly_accepted_pass():
    plain = 20.3
    passes = {d: 20 * (1 + d / 7) + 0.3 for d in range(1, 5)}
    replay = {r: 20 * r / 7 for r in range(1, 5)}  # r more rows in the next step
    every = Workload(name="repeats", drafts_per_pass=4, acceptance=1.0)
    half = Workload(name="some", drafts_per_pass=2, acceptance=0.5)
    (all_in, some), (all_in_trim, some_trim) = gains(plain, passes, 4, [every, half], replay), \
        gains(plain, passes, 4, [every, half])
    assert all_in == all_in_trim  # every draft accepted: nothing to roll back
    # two drafts, half accepted: 1 - 0.5² of the passes replay their 2 tokens in the next step
    assert some.tokens_per_pass == 2 and some.gain == pytest.approx(2 * plain / (passes[2] + 0.75 * replay[2]))
    assert some.gain < some_trim.gain


def test_the_prediction_prices_the_replay_on_every_stage_without_a_hop():
    stages = _stages()
    trim = predict(stages, [GBE, GBE], HIDDEN, speculative_tokens=4)
    replay = predict(stages, [GBE, GBE], HIDDEN, speculative_tokens=4, replays=True)
    for t, r, w in zip(trim.speculation, replay.speculation, MEASURED):
        d = max(1.0, min(4.0, w.drafts_per_pass))
        added = (1 - w.acceptance ** d) * 20 * (w.acceptance * d + 1) / 7  # both stages, accepted + 1 more rows
        assert r.tokens_per_pass == t.tokens_per_pass
        yielded = t.tokens_per_pass * trim.ms_per_token_1  # the pass's tokens at a plain token's time
        assert r.gain == pytest.approx(yielded / (yielded / t.gain + added))


def test_a_plan_of_a_family_that_refuses_speculation_predicts_none_and_says_why(monkeypatch):
    """No family of mlx-lm 0.32.2 refuses (support.SPECULATION_REFUSED is empty); one that did would
    predict none, and the timing note would give its reason."""
    from orchestrator.families import support
    from orchestrator.planner import PlanSettings, plan_cluster
    from tests.support.builders import facts
    from tests.support.planner_inputs import llama

    settings = PlanSettings(speculative_tokens=4)
    timed = [facts(i).model_copy(update={"timing": T}) for i in (0, 1)]
    plain = plan_cluster(llama(), timed, settings)
    monkeypatch.setattr(support, "SPECULATION_REFUSED", {"llama": "its chunks are not its steps"})
    refused = plan_cluster(llama(), timed, settings)
    assert plain.performance.speculation and "speculative" not in plain.performance.timing_note
    assert refused.performance.speculation == ()
    assert "no speculative decoding: its chunks are not its steps" in refused.performance.timing_note


def test_a_stepwise_pass_costs_every_stage_d_plus_one_one_row_steps_and_one_hop():
    stages = _stages()
    # five one-row steps of 10 layers at 1 ms each (no step overhead or head in T)
    assert stepwise_step_ms(stages[0], 5) == pytest.approx(5 * 10)
    assert stepwise_step_ms(stages[0], 1) == pytest.approx(verify_step_ms(stages[0], 1))
    chunked = predict(stages, [GBE, GBE], HIDDEN, speculative_tokens=4, replays=True)
    stepwise = predict(stages, [GBE, GBE], HIDDEN, speculative_tokens=4, replays=True, stepwise=True)
    hop = 0.3  # half an RTT to the next stage and half back to the coordinator, once per pass as a chunk's
    for c, w, g in zip(chunked.speculation, MEASURED, stepwise.speculation):
        d = max(1.0, min(4.0, w.drafts_per_pass))
        tokens = 1 + w.acceptance * d
        assert g.tokens_per_pass == pytest.approx(tokens) == c.tokens_per_pass
        # d + 1 one-row steps on both stages; a partly accepted pass replays accepted + 1 more one-row steps
        ms = 20 * (d + 1) + COORDINATOR_MS + hop + ((d + 1) * HIDDEN + 36) / 125e3 + (d + 1) * 64 / 125e3
        ms += (1 - w.acceptance ** d) * 20 * tokens
        assert g.gain == pytest.approx(tokens * stepwise.ms_per_token_1 / ms, rel=1e-3)
        assert g.gain < c.gain  # nothing batched: it saves the hops, not the compute


def test_plans_of_plamo3_verify_step_by_step_and_of_deepseek_v41_split_replay():
    """PLaMo 3 speculates (its pass priced as one-row steps, and the timing note says so); DeepSeek-V4.1
    split across nodes speculates as a family whose windows replay."""
    from orchestrator.families.kv_layers import LayerCache
    from orchestrator.planner import PlanSettings, plan_cluster
    from tests.support.builders import facts
    from tests.support.planner_inputs import llama

    settings = PlanSettings(speculative_tokens=4)
    timed = [facts(i).model_copy(update={"timing": T}) for i in (0, 1)]
    kv = LayerCache(kind="attention", token_bytes=384)
    windowed = {"layer_caches": (kv, kv.model_copy(update={"kind": "sliding", "window": 512}),) * 15}
    plain = plan_cluster(llama().model_copy(update=windowed), timed, settings).performance
    plamo = plan_cluster(llama(model_type="plamo3", name="plamo3-like").model_copy(update=windowed), timed,
                         settings).performance
    deepseek = plan_cluster(llama(model_type="deepseek_v41", name="v41-like").model_copy(update=windowed), timed,
                            settings).performance
    assert plamo.speculation and "speculative decoding step by step" in plamo.timing_note
    assert "d + 1 one-row steps" in plamo.timing_note
    assert [p.gain < w.gain for p, w in zip(plamo.speculation, plain.speculation)] == [True] * len(MEASURED)
    assert deepseek.speculation == plain.speculation and "speculative" not in deepseek.timing_note


def test_a_plan_of_a_windowed_model_prices_the_replay():
    from orchestrator.families.kv_layers import LayerCache
    from orchestrator.planner import PlanSettings, plan_cluster
    from tests.support.builders import facts
    from tests.support.planner_inputs import llama

    settings = PlanSettings(speculative_tokens=4)
    timed = [facts(i).model_copy(update={"timing": T}) for i in (0, 1)]
    kv = LayerCache(kind="attention", token_bytes=384)
    model = llama()
    plain = plan_cluster(model.model_copy(update={"layer_caches": (kv,) * 30}), timed, settings).performance
    windowed = plan_cluster(model.model_copy(update={"layer_caches": (kv, kv.model_copy(update={
        "kind": "sliding", "window": 512}),) * 15}), timed, settings).performance
    assert [g.gain < p.gain for g, p in zip(windowed.speculation, plain.speculation)] == [True] * len(MEASURED)
