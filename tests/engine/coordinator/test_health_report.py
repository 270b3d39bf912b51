"""`/health` read by the control plane: an odd optional part loses that part, never the verdict."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.engine.coordinator.health_report import HealthReport

STAGE = {"id": "stage-1", "address": "10.0.0.2:9000", "state": "up"}
PAUSE = {"id": "p1", "age_s": 3.0, "held": 2, "resumed": 2, "settled": True, "seconds": 1.5}


def test_the_parts_read_as_sent():
    report = HealthReport.model_validate({"status": "ready", "ready": True, "pause": PAUSE,
                                          "stages": [{**STAGE, "progress": {"busy_s": 0.5}}]})
    assert report.pause is not None and report.pause.resumed == 2
    assert report.stage("stage-1").progress is not None


@pytest.mark.parametrize("odd", [{"id": "p1"}, "held", 7, {"age_s": "soon", "id": "p1"}])
def test_an_odd_pause_record_is_dropped_and_the_verdict_stays(odd):
    report = HealthReport.model_validate({"status": "ready", "ready": True, "pause": odd, "stages": [STAGE]})
    assert report.pause is None and report.ready and report.stage("stage-1").state == "up"


@pytest.mark.parametrize("odd", [{"busy_s": "long"}, [1, 2], "computing"])
def test_an_odd_stage_progress_is_dropped_and_the_stage_stays(odd):
    report = HealthReport.model_validate({"status": "unhealthy", "ready": False,
                                          "stages": [{**STAGE, "state": "wedged", "progress": odd}]})
    assert report.stage("stage-1").progress is None and report.stage("stage-1").state == "wedged"


def test_an_odd_verdict_is_still_refused():
    with pytest.raises(ValidationError):
        HealthReport.model_validate({"status": "fine", "ready": True})
