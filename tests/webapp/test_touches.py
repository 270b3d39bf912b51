"""The webapp's table of what each control-plane event refreshes (webapp/touches.py): every event
class is in it, it names only live components, and every live component is touched by some event."""

from __future__ import annotations

import pytest

from orchestrator.control.rules import events as ev
from webapp.touches import LIVE_COMPONENTS, TOUCHES

CLASSES = ev.event_classes()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_event_class_says_what_it_touches(cls):
    assert cls in TOUCHES, f"{cls.__name__} is missing from webapp/touches.py's TOUCHES"
    unknown = TOUCHES[cls] - LIVE_COMPONENTS
    assert not unknown, f"{cls.__name__} touches unknown components {unknown}"


def test_every_live_component_is_touched_and_only_event_classes_are_listed():
    assert {c for touched in TOUCHES.values() for c in touched} == LIVE_COMPONENTS
    assert set(TOUCHES) == set(CLASSES)
