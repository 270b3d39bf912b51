"""The performance model (planner/predict.py, placement.py): hand-checked tables."""

from __future__ import annotations

import pytest

from orchestrator.planner import PlanSettings, plan_cluster
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.predict import (
    COORDINATOR_MS,
    HEADER_BYTES,
    RESULT_BYTES,
    StageSpec,
    aggregate_tps,
    bottleneck,
    decode_ms_1,
    predict,
    single_node_verdict,
    ttft_s,
)
from tests.support.builders import GB, facts
from tests.support.planner_inputs import llama, uniform

# 1 ms per layer alone, 1 ms at batch 1 with base threads, 2 ms for 8 rows; no head; 0.1 ms
# per prompt token per layer.
T = LayerTiming(layer_ms_b1_solo=1.0, layer_ms_b1=1.0, layer_ms_bB=2.0, batch=8, prefill_ms_per_token=0.1)
SLOW = T.model_copy(update={"layer_ms_b1_solo": 2.0, "layer_ms_b1": 2.0, "layer_ms_bB": 4.0,
                            "prefill_ms_per_token": 0.2})
FREE = LinkCost(rtt_ms=0.0, bandwidth_Bps=1e15)  # a link that costs nothing
GBE = LinkCost(rtt_ms=0.3, bandwidth_Bps=125e6)
WIFI = LinkCost(rtt_ms=6.0, bandwidth_Bps=37.5e6)
HIDDEN = 2304  # SmolLM2: 576 float32


def stage(layers: float, last: bool = False, timing: LayerTiming = T, name: str = "n") -> StageSpec:
    return StageSpec(label=f"stage on {name}", node_name=name, layer_weight=layers, last=last, timing=timing)


@pytest.mark.parametrize("links, expected_ms", [
    ((FREE, FREE), 10 + 20 + COORDINATOR_MS),
    ((GBE, GBE), 30 + 0.15 + (HIDDEN + HEADER_BYTES) / 125e3 + 0.15 + RESULT_BYTES / 125e3 + COORDINATOR_MS),
    ((WIFI, WIFI), 30 + 6.0 + (HIDDEN + HEADER_BYTES) / 37.5e3 + RESULT_BYTES / 37.5e3 + COORDINATOR_MS),
])
def test_one_request_is_every_stage_plus_every_hop(links, expected_ms):
    ms, compute = decode_ms_1([stage(10), stage(20, last=True)], links, HIDDEN)
    assert compute == pytest.approx(30)
    assert ms == pytest.approx(expected_ms)


@pytest.mark.parametrize("requests, expected_tps", [
    # 2 requests: 2 groups of 1, a round is 10 + 10 + 0.3 ms, two groups per round
    (2, 2 * 1000 / 20.3),
    # 16 requests: groups of 8 rows, each stage 20 ms per group: 2 groups per 40.3 ms round
    (16, 16 * 1000 / 40.3),
])
def test_aggregate_keeps_one_group_per_stage_in_flight(requests, expected_tps):
    stages = [stage(10), stage(10, last=True)]
    assert aggregate_tps(stages, [FREE, FREE], HIDDEN, requests) == pytest.approx(expected_tps)


def test_aggregate_is_limited_by_the_slowest_stage():
    stages = [stage(10), stage(10, last=True, timing=SLOW)]  # 20 vs 40 ms per group of 8
    # the round is 60.3 ms, but the slow stage must serve both groups: 80 ms per cycle
    assert aggregate_tps(stages, [FREE, FREE], HIDDEN, 16) == pytest.approx(16 * 1000 / 80)
    assert bottleneck(stages, [FREE, FREE], HIDDEN, 16).startswith("stage on n: 40.0 ms")


def test_a_thin_link_is_the_bottleneck():
    thin = LinkCost(rtt_ms=0.1, bandwidth_Bps=1e6)  # 8 rows x 2340 B = 18.7 ms per group
    stages = [stage(1), stage(1, last=True)]
    assert "link n → n" in bottleneck(stages, [thin, FREE], HIDDEN, 16)
    assert "link latency" in bottleneck([stage(1), stage(1, last=True)], [WIFI, WIFI], HIDDEN, 16)


@pytest.mark.parametrize("links, expected_s", [
    # 4097 tokens: chunks [0, 2048) and [2048, 4096), 204.8 ms per chunk per stage (1 layer
    # each). Stage 1 runs chunk 1 while stage 0 runs chunk 2: 3 chunk times, then the sampled
    # token's decode step on the last stage (stage 0's ran during stage 1's chunk 2).
    ((FREE, FREE), (3 * 204.8 + 1 + COORDINATOR_MS) / 1000),
    # Over wifi, only the first chunk's crossing (3 ms + 4.7 MB at 37.5 MB/s) delays the
    # pipeline, then the last token's hops.
    ((WIFI, WIFI), (3 * 204.8 + 3 + (2048 * HIDDEN + HEADER_BYTES) / 37.5e3 + 1
                    + 3 + RESULT_BYTES / 37.5e3 + COORDINATOR_MS) / 1000),
])
def test_prefill_chunks_overlap_across_stages(links, expected_s):
    stages = [stage(1), stage(1, last=True)]
    assert ttft_s(stages, links, HIDDEN, 4097) == pytest.approx(expected_s, rel=1e-6)


def test_stages_on_one_machine_share_its_cores_for_a_prompt():
    """Chunks run SOLO. When a step on every core is twice as fast as on the base thread (all
    the cores help), two stages on one machine gain nothing by overlapping: 4 chunk times, then
    the sampled token's step on each. When more cores do not help, they overlap as apart."""
    scales = T.model_copy(update={"layer_ms_b1": 2.0})
    shared = [stage(1, timing=scales).model_copy(update={"machine": "m"}),
              stage(1, last=True, timing=scales).model_copy(update={"machine": "m"})]
    assert ttft_s(shared, (FREE, FREE), HIDDEN, 4097) == pytest.approx((4 * 204.8 + 2 + COORDINATOR_MS) / 1000,
                                                                       rel=1e-6)
    apart = [s.model_copy(update={"machine": f"m{k}"}) for k, s in enumerate(shared)]
    overlap = (3 * 204.8 + 1 + COORDINATOR_MS) / 1000
    assert ttft_s(apart, (FREE, FREE), HIDDEN, 4097) == pytest.approx(overlap, rel=1e-6)
    no_gain = [stage(1).model_copy(update={"machine": "m"}), stage(1, last=True).model_copy(update={"machine": "m"})]
    assert ttft_s(no_gain, (FREE, FREE), HIDDEN, 4097) == pytest.approx(overlap, rel=1e-6)


def test_prefill_grows_with_context():
    t = T.model_copy(update={"prefill_ms_per_token_per_k": 0.1})
    # every token is scored against all keys so far (the chunk's own included)
    assert t.prefill_ms(0, 1000) == pytest.approx(1000 * (0.1 + 0.1))
    assert t.prefill_ms(1000, 1000) == pytest.approx(1000 * (0.1 + 0.2))


@pytest.mark.parametrize("single_tps, split_tps, single_agg, split_agg, text", [
    (16.0, 10.0, 16.0, 36.8, "a single node (a) would be ~1.6× faster for one request; "
                             "the split serves 2.3× more tokens/s at 16 requests"),
    (10.0, 10.2, 30.0, 30.5, "the split is about as fast as a alone for one request; "
                             "both serve about the same tokens/s at 16 requests"),
    (8.0, 10.0, 40.0, 20.0, "the split is ~1.2× faster for one request than a alone; "
                            "a alone would serve 2.0× more tokens/s at 16 requests"),
])
def test_single_node_verdict(single_tps, split_tps, single_agg, split_agg, text):
    def perf(tps, agg):
        p = predict([stage(1, last=True)], [FREE], HIDDEN, requests=[16])
        return p.model_copy(update={"decode_tps_1": tps, "aggregate_tps": (p.aggregate_tps[0].model_copy(
            update={"y": agg}),)})
    assert single_node_verdict(perf(split_tps, split_agg), perf(single_tps, single_agg), "a") == text


def timed(i: int, timing: LayerTiming, free: int = 8 * GB, **links: LinkCost):
    return facts(i, free).model_copy(update={"timing": timing, "links": links})


def test_the_plan_gives_a_slow_node_fewer_layers_and_predicts():
    model = llama()
    fast, slow = timed(0, T), timed(1, SLOW)
    plan = plan_cluster(model, [fast, slow])
    assert plan.kind == "plan"
    (a0, a1), (b0, b1) = plan.split
    assert a1 - a0 + 1 == 20 and b1 - b0 + 1 == 10  # 2:1 by time, not 15:15 by bytes
    perf = plan.performance
    assert perf is not None and perf.decode_tps_1 > 0 and perf.ttft(8192) > perf.ttft(1024) > 0
    assert [p.x for p in perf.aggregate_tps] == [4, 8, 16]
    assert "fits on node" not in (perf.single_node or "")
    assert perf.single_node.startswith("a single node (node0) would be")  # 8 GB free: the model fits alone
    untimed = plan_cluster(model, [facts(0), facts(1)])
    assert untimed.performance is None and untimed.split == ((0, 18), (19, 29))  # by bytes: the embedding counts


def test_a_node_without_timing_borrows_one_with_the_same_accelerator():
    plan = plan_cluster(llama(), [timed(0, T), facts(1)])
    assert plan.performance is not None
    assert "node1 assumed alike" in plan.performance.timing_note


def test_nodes_on_one_machine_are_named_and_their_long_prompts_take_longer():
    scales = T.model_copy(update={"layer_ms_b1": 1.6})  # every core helps: 1.6x faster SOLO
    apart = plan_cluster(llama(), [timed(0, scales), timed(1, scales)]).performance
    one = [timed(i, scales).model_copy(update={"machine": "m1"}) for i in (0, 1)]
    shared = plan_cluster(llama(), one).performance
    assert "node0 and node1 share one machine's cores" in shared.timing_note and "share" not in apart.timing_note
    assert shared.ttft(8192) > apart.ttft(8192) and shared.decode_tps_1 == pytest.approx(apart.decode_tps_1)


def test_a_manual_split_shows_the_automatic_one_beside_it():
    plan = plan_cluster(llama(), [timed(0, T), timed(1, SLOW)], PlanSettings(manual_split=((0, 14), (15, 29))))
    assert plan.performance.automatic.startswith("automatic split 0–19 / 20–29:")


def test_order_follows_the_fastest_links():
    # n0 - n2 - n1 is the short ring; n1 - n2 is wifi-slow when given as n0, n1, n2 ...
    ring = [timed(0, T, n1=GBE, n2=GBE), timed(1, T, n2=WIFI), timed(2, T)]
    plan = plan_cluster(uniform(6), ring)
    assert [s.node_id for s in plan.stages] == ["n0", "n1", "n2"]  # every ring has one wifi hop: keep it
    ring = [timed(0, T, n1=WIFI, n2=GBE), timed(1, T, n2=GBE), timed(2, T)]
    plan = plan_cluster(uniform(6), ring)
    assert [s.node_id for s in plan.stages] == ["n0", "n2", "n1"] or \
        [s.node_id for s in plan.stages] == ["n0", "n1", "n2"]  # a ring: both directions cross the wifi once
    four = [timed(0, T, n1=GBE, n2=WIFI, n3=GBE), timed(1, T, n2=GBE, n3=WIFI), timed(2, T, n3=GBE), timed(3, T)]
    plan = plan_cluster(uniform(8), four)
    assert [s.node_id for s in plan.stages] == ["n0", "n1", "n2", "n3"]  # already the all-GbE ring
    four = [timed(0, T, n1=WIFI, n2=GBE, n3=GBE), timed(1, T, n2=GBE, n3=GBE), timed(2, T, n3=WIFI), timed(3, T)]
    plan = plan_cluster(uniform(8), four)
    assert [s.node_id for s in plan.stages] == ["n0", "n2", "n1", "n3"]  # avoids both wifi pairs


# Measured per-step paths (engine/profiling/step.py): 0.5 ms a step for a stage passing hidden
# states on, 1 ms for the last stage, 2 ms for the coordinator at 1 row; 4, 8 and 9 ms at 8.
PATHS = T.model_copy(update={"step_ms_b1": 0.5, "step_ms_bB": 4.0, "last_step_ms_b1": 1.0, "last_step_ms_bB": 8.0,
                             "coordinator_ms_b1": 2.0, "coordinator_ms_bB": 9.0})


def test_old_profiles_without_paths_load_and_predict_as_before():
    old = LayerTiming.model_validate({"layer_ms_b1_solo": 1.0, "layer_ms_b1": 1.0, "layer_ms_bB": 2.0,
                                      "prefill_ms_per_token": 0.1})
    assert (old.step_overhead_ms(1, False), old.step_overhead_ms(8, True), old.coordinator_ms(4)) == (0, 0, 0)
    ms, _ = decode_ms_1([stage(10, timing=old), stage(20, last=True, timing=old)], [FREE, FREE], HIDDEN)
    assert ms == pytest.approx(30 + COORDINATOR_MS)  # the fallback constant, nothing per stage


def test_paths_are_linear_in_rows_between_1_and_b():
    assert PATHS.step_overhead_ms(1, last=False) == 0.5
    assert PATHS.step_overhead_ms(8, last=True) == 8.0
    assert PATHS.step_overhead_ms(2, last=True) == pytest.approx(2.0)  # 1 + 7 x 1/7
    assert PATHS.coordinator_ms(4) == pytest.approx(5.0)  # 2 + 7 x 3/7
    assert PATHS.coordinator_ms(15) == pytest.approx(16.0)  # per-row costs go on past B


def test_one_request_pays_every_stages_path_and_the_measured_coordinator():
    stages = [stage(10, timing=PATHS), stage(20, last=True, timing=PATHS)]
    ms, compute = decode_ms_1(stages, [FREE, FREE], HIDDEN)
    # 30 ms of layers, 0.5 (stage 0 passes hidden states on) + 1 (the last stage's results)
    # of path, and the coordinator's 2 ms measured on stage 0's node instead of COORDINATOR_MS
    assert compute == pytest.approx(31.5)
    assert ms == pytest.approx(33.5)
    assert predict(stages, [FREE, FREE], HIDDEN).decode_tps_1 == pytest.approx(1000 / 33.5)


def test_groups_pay_the_paths_at_their_rows():
    stages = [stage(10, timing=PATHS), stage(10, last=True, timing=PATHS)]
    # 16 requests: 2 groups of 8; steps 20 + 4 and 20 + 8 ms, the round adds the coordinator's 9
    # ms: 61 ms; the last stage serves both groups in 56: the round bounds the cycle
    assert aggregate_tps(stages, [FREE, FREE], HIDDEN, 16) == pytest.approx(16 * 1000 / 61)
    # 4 requests: groups of 2: layers 10 x (1 + 1/7) ms on each stage, paths 1 and 2 ms, the
    # coordinator 3 ms: a round of 2 x 11.43 + 1 + 2 + 3 = 28.86 ms for 4 tokens
    layers = 10 * (1 + 1 / 7)
    assert aggregate_tps(stages, [FREE, FREE], HIDDEN, 4) == pytest.approx(4 * 1000 / (2 * layers + 1 + 2 + 3))


def test_every_prefill_chunk_pays_the_stage_path_once():
    bare = [stage(10), stage(10, last=True)]
    paths = [stage(10, timing=PATHS), stage(10, last=True, timing=PATHS)]
    # 4097 tokens: 2 chunks of 2048 then the sampling step; one stage at a time on FREE links
    extra = ttft_s(paths, [FREE, FREE], HIDDEN, 4097) - ttft_s(bare, [FREE, FREE], HIDDEN, 4097)
    # the last token: 0.5 on stage 0 and 1 on the last stage, the coordinator's 2 ms instead of
    # COORDINATOR_MS; the chunks (a flow shop): 0.5 each on the critical path, which crosses two
    # or three of the four (stage, chunk) items depending on which stage is the slower
    fixed = 0.5 + 1 + (2 - COORDINATOR_MS)
    assert fixed + 2 * 0.5 - 1e-9 <= extra * 1000 <= fixed + 3 * 0.5 + 1e-9


def test_steps_go_through_the_measured_row_counts():
    # measured: 1 row 1 ms, 2 rows 1.5, 4 rows 1.8, 8 rows 2 (per layer; the head likewise x10)
    t = T.model_copy(update={"layer_ms_rows": ((2, 1.5), (4, 1.8)), "head_ms_rows": ((2, 15.0), (4, 18.0)),
                             "head_ms_b1": 10.0, "head_ms_bB": 20.0})
    assert [t.layer_ms(r) for r in (1, 2, 3, 4, 6, 8)] == pytest.approx([1.0, 1.5, 1.65, 1.8, 1.9, 2.0])
    assert t.layer_ms(16) == pytest.approx(2.4)  # past B along the last piece (4 -> 8)
    assert t.head_ms(3) == pytest.approx(16.5)
    assert T.layer_ms(2) == pytest.approx(1 + 1 / 7)  # without them: the line from 1 to B
    # 4 requests over 2 stages run groups of 2: 10 layers x 1.5 and 10 x 1.5 + 15 of head
    stages = [stage(10, timing=t), stage(10, last=True, timing=t)]
    assert aggregate_tps(stages, [FREE, FREE], HIDDEN, 4) == pytest.approx(4 * 1000 / max(15 + 30 + COORDINATOR_MS,
                                                                                           2 * 30))
