"""A manual split is validated like the balancer's: shape first, then memory, then warnings."""

from __future__ import annotations

import pytest

from orchestrator.planner import Plan, PlanSettings, Refusal, RefusalCode, WarningCode, check_split, plan_cluster
from tests.support.builders import GB, facts_for
from tests.support.planner_inputs import llama

MODEL = llama()  # 30 layers


def manual(*ranges: tuple[int, int]) -> PlanSettings:
    return PlanSettings(context_length=1024, max_concurrent_sequences=1, manual_split=ranges)


INVALID = [
    ("too few ranges", ((0, 29),), 2, ["1 ranges for 2 selected nodes"]),
    ("too many ranges", ((0, 9), (10, 19), (20, 29)), 2, ["3 ranges for 2 selected nodes"]),
    ("gap", ((0, 9), (11, 29)), 2, ["stage 1 starts at layer 11, expected 10: the range leaves a gap"]),
    ("overlap", ((0, 15), (10, 29)), 2, ["stage 1 starts at layer 10, expected 16: the range overlaps"]),
    ("not from layer 0", ((1, 15), (16, 29)), 2, ["stage 0 starts at layer 1, expected 0"]),
    ("negative start", ((-1, 15), (16, 29)), 2, ["stage 0 starts at layer -1, expected 0"]),
    ("empty stage", ((0, 29), (30, 29)), 2, ["stage 1 range 30-29 is empty (last layer before first)"]),
    ("ends early", ((0, 14), (15, 28)), 2, ["ranges end at layer 28 but the model has layers 0-29"]),
    ("ends late", ((0, 14), (15, 30)), 2, ["ranges end at layer 30 but the model has layers 0-29"]),
    ("out of order", ((15, 29), (0, 14)), 2, ["stage 0 starts at layer 15", "stage 1 starts at layer 0"]),
]


@pytest.mark.parametrize("case,split,stages,messages", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_manual_split_is_refused(case: str, split, stages: int, messages: list[str]) -> None:
    result = plan_cluster(MODEL, facts_for(*[8 * GB] * stages), manual(*split))
    assert isinstance(result, Refusal)
    assert set(result.codes) == {RefusalCode.INVALID_SPLIT}
    text = " | ".join(r.message for r in result.reasons)
    assert all(m in text for m in messages), text
    assert all(r.message.startswith("manual split: ") for r in result.reasons)
    assert result.stages == ()


def test_check_split_accepts_a_valid_split() -> None:
    assert check_split(((0, 0), (1, 28), (29, 29)), 30, 3) == []


def test_valid_manual_split_is_used_as_given() -> None:
    plan = plan_cluster(MODEL, facts_for(8 * GB, 8 * GB), manual((0, 9), (10, 29)))
    assert isinstance(plan, Plan) and plan.manual and plan.split == ((0, 9), (10, 29))
    assert WarningCode.IMBALANCED in plan.warning_codes  # 10 layers against 20 and the head


def test_manual_split_that_does_not_fit_names_the_node() -> None:
    s = manual((0, 27), (28, 29))
    result = plan_cluster(MODEL, facts_for(500_000_000, 8 * GB), s)
    assert isinstance(result, Refusal) and result.codes == (RefusalCode.STAGE_DOES_NOT_FIT,)
    assert result.reasons[0].node_id == "n0" and result.reasons[0].missing_bytes > 0
    assert [st.layers for st in result.stages] == ["0-27", "28-29"]
    # The balancer finds a split that fits the same nodes.
    auto = plan_cluster(MODEL, facts_for(500_000_000, 8 * GB), s.model_copy(update={"manual_split": None}))
    assert isinstance(auto, Plan) and not auto.manual and all(st.fits for st in auto.stages)
