"""The Faults tab says what became of the answers in flight during each recovery (issue 37): the
coordinator's pause, as `RequestsResumed` recorded it on the fault."""

from __future__ import annotations

from orchestrator.control.rules.state import Fault, ResumedRequests
from tests.support.builders import session
from tests.support.control_states import BASE
from tests.support.html import parse
from tests.webapp.conftest import Web


def test_a_fault_s_entry_counts_the_answers_resumed_and_lost_with_the_pause(still: Web):
    resumed = ResumedRequests(pause="p1", held=3, resumed=3, lost=0, seconds=12.34, ready_s=8.0)
    idle = Fault(at=100.0, reason="stage-0 lost", processes=("stage-0",), outcome="recovered", recovery_s=9.0)
    busy = Fault(at=200.0, reason="stage-1 lost", processes=("stage-1",), outcome="recovered", recovery_s=7.5,
                 resumed=resumed)
    still.orch._state = BASE.model_copy(update={"sessions": (session(faults=(idle, busy)),)})
    page = parse(still.client("viewer").get("/sessions").get_data(as_text=True))
    newest, oldest = page.find_all("li", **{"class": "fault fault-recovered"})
    assert "stage-1 lost" in newest.text and "3 requests resumed, 0 lost in 12.3 s" in newest.text
    assert "stage-0 lost" in oldest.text and "resumed" not in oldest.text  # nothing was held then
