"""One selection on the Distributed page (pure): whether the shown plan and preparation belong to
the model, nodes and context a user has chosen, and why Launch must wait.

The plan and the preparation are shared state (every viewer sees the last ones), while each
admin's form holds their own choice; so every card says which selection it is about and the
form asks these rules whether that is the one it shows. The same rules decide what Launch
and Prepare refuse (decide.py, webapp/actions.py): an enabled Launch never refuses for a
reason the form could have known.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.control.rules.decide import serving_conflict
from orchestrator.control.rules.state import Preparation, PreviewedPlan, State
from orchestrator.planner import Refusal


@dataclass(frozen=True)
class Selection:
    """What the Serve-as-cluster form has chosen: a model (None: nothing to choose from yet),
    nodes by id, the context length, and the hub repo Prepare would download from ("": none)."""

    model_id: str | None
    node_ids: tuple[str, ...]
    context_length: int = 4096
    hub_repo: str = ""
    hub_model_id: str = ""  # the model id the hub repo gets on the nodes ("" without a repo)


def names_of(state: State, node_ids: tuple[str, ...] | list[str]) -> str:
    """Node names in words: "node-a, node-b" (an unknown id as itself)."""
    names = {n.id: n.name for n in state.nodes}
    return ", ".join(names.get(nid, nid) for nid in node_ids)


def plan_matches(plan: PreviewedPlan, chosen: Selection) -> bool:
    """The plan is of this model, these nodes (any order: the planner orders them) and context."""
    return (plan.model_id == chosen.model_id and set(plan.node_ids) == set(chosen.node_ids)
            and plan.context_length == chosen.context_length)


def preparation_matches(prep: Preparation, chosen: Selection) -> bool:
    """The preparation is of this model and covers every chosen node (Launch accepts a superset)."""
    return prep.model_id == chosen.model_id and bool(chosen.node_ids) and \
        set(chosen.node_ids) <= {n.node_id for n in prep.nodes}


def plan_label(state: State, plan: PreviewedPlan) -> str:
    """Which selection a plan is about: "for smol on node-a, node-b at 2048 tokens"."""
    return f"for {plan.model_id} on {names_of(state, plan.node_ids)} at {plan.context_length} tokens"


def preparation_label(state: State, prep: Preparation) -> str:
    """Which selection a preparation is about: "for smol on node-a, node-b"."""
    return f"for {prep.model_id} on {names_of(state, [n.node_id for n in prep.nodes])}"


def hub_conflict(chosen: Selection) -> str | None:
    """Why the Hub repo field disagrees with the chosen model (None when it agrees or is empty):
    Prepare would download the repo's model, not the one the cards and Launch are about."""
    if not chosen.hub_repo or not chosen.hub_model_id or chosen.hub_model_id == chosen.model_id:
        return None
    return (f"Hub repo {chosen.hub_repo} is the model {chosen.hub_model_id}, not the selected "
            f"{chosen.model_id}: choose {chosen.hub_model_id} as the model, or clear the Hub repo")


def launch_blocker(state: State, chosen: Selection) -> str | None:
    """Why Launch cluster must wait for this selection, in words (None: it may launch). Checked
    in the order a user goes: the choice itself, the hub repo, a running cluster, the shard plan
    of this very selection (previewed, not refused: so an enabled Launch does not refuse), then
    the preparation."""
    if not chosen.model_id:
        return "choose a model"
    if len(chosen.node_ids) < 2:
        return "choose at least 2 nodes"
    conflict = hub_conflict(chosen) or serving_conflict(state, chosen.model_id, list(chosen.node_ids))
    if conflict:
        return conflict
    plan = state.plan
    if plan is None or not plan_matches(plan, chosen):
        return (f"Preview shard plan of {chosen.model_id} on {names_of(state, chosen.node_ids)} at "
                f"{chosen.context_length} tokens first" + (f" (the plan shown is {plan_label(state, plan)})"
                                                            if plan is not None else ""))
    if isinstance(plan.result, Refusal):
        reasons = plan.result.reasons
        return "the shard plan is refused" + (f": {reasons[0].message}" if reasons else "")
    prep = state.preparation
    if prep is None:
        return "Prepare on all nodes first: launching needs every selected node's copy Present (verified)"
    if not preparation_matches(prep, chosen):
        return (f"the preparation shown is {preparation_label(state, prep)}, not this selection: "
                "Prepare on all nodes again")
    if not prep.finished:
        return "preparation is still running"
    if not prep.ready:
        return "preparation did not finish with every node's copy Present: Prepare on all nodes again"
    return None
