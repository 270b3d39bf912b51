"""Every warning, table-driven: a plan is still made, and the warning says what and where."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from orchestrator.planner import Plan, PlanSettings, StageCosts, WarningCode, plan_cluster
from tests.support.builders import GB, facts_for
from tests.support.planner_inputs import llama, uniform

SETTINGS = PlanSettings(context_length=1024, max_concurrent_sequences=1)
MODEL = llama()
WHOLE = StageCosts(MODEL, SETTINGS).single_node_bytes()
# on two nodes 70% full on average; alone it does not fit
ROOMY = int(StageCosts(MODEL, SETTINGS).cluster_bytes(2) / 2 / 0.7)
assert ROOMY < WHOLE
# A toy whose forced 1 + 1 split is lopsided: the last layer also carries a head twice its size.
LOPSIDED = uniform(2, 1000, head=2000, embedding=10, vocab=10)
TOY_SETTINGS = PlanSettings(context_length=8, max_concurrent_sequences=1, stage_overhead_bytes=0,
                            coordinator_overhead_bytes=0)


@dataclass
class Case:
    id: str
    nodes: list
    codes: list[WarningCode]
    names: list[str] = field(default_factory=list)
    node_ids: list[str | None] = field(default_factory=list)
    model: object = MODEL
    settings: PlanSettings = SETTINGS


CASES = [
    Case("clean: no warnings", facts_for(ROOMY, ROOMY), []),
    Case("three stages", facts_for(ROOMY, ROOMY, ROOMY), [WarningCode.MANY_STAGES], ["3 stages", "validated on 2"]),
    Case("fits on one node", facts_for(ROOMY, WHOLE, 8 * GB), [WarningCode.MANY_STAGES, WarningCode.FITS_ON_ONE_NODE,
                                                          WarningCode.FITS_ON_ONE_NODE],
         ["fits on node node1 alone", "node node2 alone", "capacity, not speed"], [None, "n1", "n2"]),
    Case("imbalanced: 2 layers and a huge head", facts_for(6000, 6000), [WarningCode.IMBALANCED],
         ["stage 1 on node1 (layers 1-1)", "3.00x", "stage 0 on node0"], ["n1"], model=LOPSIDED,
         settings=TOY_SETTINGS),
    Case("tight fit", facts_for(6500, 6500), [WarningCode.TIGHT_FIT, WarningCode.TIGHT_FIT],
         ["stage 0 uses 94% of node node0's", "stage 1 uses 94% of node node1's"], ["n0", "n1"],
         model=uniform(4, 1000), settings=TOY_SETTINGS),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_warning(case: Case) -> None:
    plan = plan_cluster(case.model, case.nodes, case.settings)
    assert isinstance(plan, Plan), plan
    assert list(plan.warning_codes) == case.codes, plan.warnings
    text = " | ".join(w.message for w in plan.warnings)
    for name in case.names:
        assert name in text
    if case.node_ids:
        assert [w.node_id for w in plan.warnings] == case.node_ids


def test_warning_codes_are_all_covered() -> None:
    assert {code for c in CASES for code in c.codes} == set(WarningCode)


def test_imbalance_threshold_is_a_setting() -> None:
    lax = TOY_SETTINGS.model_copy(update={"imbalance_threshold": 3.5})
    plan = plan_cluster(LOPSIDED, facts_for(6000, 6000), lax)
    assert isinstance(plan, Plan) and not plan.warnings


def test_imbalance_is_relative_to_free_memory() -> None:
    """Twice the work on a node with twice the memory is balanced; equal work there is not."""
    even = TOY_SETTINGS.model_copy(update={"manual_split": ((0, 1), (2, 3))})
    plan = plan_cluster(uniform(4, 10_000), facts_for(80_000, 40_000), even)
    assert isinstance(plan, Plan) and WarningCode.IMBALANCED in plan.warning_codes  # 20000/80000 vs 20000/40000
    assert "2.00x" in plan.warnings[-1].message
    plan = plan_cluster(uniform(3, 10_000), facts_for(80_000, 40_000), TOY_SETTINGS)
    assert isinstance(plan, Plan) and plan.split == ((0, 1), (2, 2))
    assert WarningCode.IMBALANCED not in plan.warning_codes
