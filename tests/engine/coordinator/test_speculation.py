"""When the coordinator drafts: only for a request alone in the pipeline (engine/coordinator/speculation.py)."""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator.speculation import drafts_now


@pytest.mark.parametrize(("members", "active", "drafts"), [
    (1, 1, True),  # one request, nothing else admitted: the case speculation is for
    (1, 2, False),  # alone in its micro-batch while another decodes in the other one (2 requests, 2 stages)
    (1, 4, False),  # its first step while three others still prefill
    (2, 2, False),  # a batched step
    (2, 4, False),
])
def test_only_a_request_alone_in_the_pipeline_drafts(members, active, drafts):
    assert drafts_now(members, active) is drafts


def test_tests_can_let_every_step_draft():
    assert drafts_now(2, 4, alone_only=False) and drafts_now(1, 3, alone_only=False)
