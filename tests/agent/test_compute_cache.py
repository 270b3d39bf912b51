"""The agent's cached compute profiles (agent/compute.py): a profile from an older engine is stale."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.agent import compute
from orchestrator.logs import EventLogger
from tests.support.engine_jobs import ModelsFolder

PROFILE = {"batch": 8, "layer_ms_b1_solo": 1.0, "layer_ms_b1": 1.0, "layer_ms_bB": 2.0, "prefill_ms_per_token": 0.1,
           "step_ms_b1": 0.1, "coordinator_ms_bB": 0.3}


def _profiler(tmp_path: Path) -> compute.ComputeProfiler:
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    return compute.ComputeProfiler(ModelsFolder(tmp_path / "models"), tmp_path / "state", EventLogger("test"))


def test_a_current_profile_is_served_with_its_step_paths(tmp_path):
    p = _profiler(tmp_path)
    (tmp_path / "state" / "profiles" / "m.json").write_text(json.dumps({"stamp": p._stamp("m"), "profile": PROFILE}))
    found = p.cached("m")
    assert found is not None and found.step_ms_b1 == 0.1 and found.coordinator_ms_bB == 0.3


def test_a_profile_from_before_the_step_paths_is_timed_again(tmp_path):
    p = _profiler(tmp_path)
    size, mtime, _version, _key = p._stamp("m")
    old = {k: v for k, v in PROFILE.items() if "step" not in k and "coordinator" not in k}
    (tmp_path / "state" / "profiles" / "m.json").write_text(json.dumps({"stamp": [size, mtime], "profile": old}))
    assert p.cached("m") is None
    assert p.status("m").state == "absent"  # so a plan's measure() starts a new timing
