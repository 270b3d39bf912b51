"""Every event class says, next to its fields, whether it is saved (pure). Which dashboard components
each refreshes is the webapp's table (tests/webapp/test_touches.py)."""

from __future__ import annotations

import pytest

from orchestrator.control import store
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import PreviewedPlan, State
from orchestrator.planner import Refusal

CLASSES = ev.event_classes()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_event_class_declares_persisted(cls):
    assert isinstance(cls.__dict__.get("persisted"), bool), f"{cls.__name__} must declare persisted"
    assert ev.kind_of(cls) and ev.kind_of(cls) != "None"


def test_kinds_are_unique_and_the_other_topics_events_are_found():
    kinds = [ev.kind_of(c) for c in CLASSES]
    assert len(kinds) == len(set(kinds))
    assert {"model_download_started", "layer_timing_changed"} <= set(kinds)


def test_what_must_survive_a_restart_is_persisted():
    persisted = {ev.kind_of(c) for c in CLASSES if c.persisted}
    # settings, nodes and every change of a live session (store.py keeps exactly those)
    assert {"settings_changed", "node_registered", "node_removed", "session_created", "launch_stepped",
            "session_registered", "session_faulted", "health_changed", "session_removed", "post_mortem_recorded",
            "recovery_failed", "session_recovered"} <= persisted
    # what the store does not keep, or what is seen again after a restart
    assert not persisted & {"node_reported", "node_unreachable", "node_discovered", "node_vanished", "plan_previewed",
                            "preparation_started", "preparation_progressed", "preparation_finished",
                            "session_observed"}


def test_the_previewed_plan_is_typed_and_its_json_is_the_planners_with_what_was_asked():
    shown = PreviewedPlan(model_id="m", node_ids=("a", "b"), context_length=2048,
                          result=Refusal(model="m", reasons=()))
    doc = State(plan=shown).model_dump(mode="json")["plan"]
    assert doc == {"model_id": "m", "node_ids": ["a", "b"], "context_length": 2048, "kind": "refusal", "model": "m",
                   "reasons": [], "stages": []}
    assert PreviewedPlan.model_validate(doc) == shown  # the flat JSON reads back


def test_the_plan_is_not_persisted(tmp_path):
    shown = PreviewedPlan(model_id="m", node_ids=("a",), context_length=8, result=Refusal(model="m", reasons=()))
    store.save(tmp_path, State(plan=shown))
    assert store.load(tmp_path).plan is None
