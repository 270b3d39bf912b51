"""The agent reuses a timing across models of one family, layer shapes, dtype and backend
(agent/compute.py with families/timing_key.py), keeps it across a restart, and times afresh a
model that differs in any of them; the timing process is injected (no model is timed here)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from orchestrator.agent import compute
from orchestrator.logs import EventLogger
from orchestrator.testmodels.llama import make_test_model
from tests.support.engine_jobs import ModelsFolder

TIMED = {"batch": 8, "layer_ms_b1_solo": 1.0, "layer_ms_b1": 1.0, "layer_ms_bB": 2.5, "prefill_ms_per_token": 0.1,
         "layer_ms_rows": [[2, 1.2], [4, 1.6]], "spread": 0.05, "layers_timed": 2}
BACKEND = {"mlx": {"mlx": "0.32.4"}, "blas": ["openblas"], "threads": [1, 1], "cpus": 2, "machine": "x86_64"}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_test_model(tmp_path_factory.mktemp("m") / "base", layers=4, hidden=64)


@pytest.fixture
def models(tmp_path: Path, base: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(base, root / "base")
    shutil.copytree(base, root / "fine-tune")  # the same shapes under another id
    make_test_model(root / "wider", layers=4, hidden=128)
    make_test_model(root / "half", layers=4, hidden=64, dtype="float16")
    return root


class Profiler:
    """A ComputeProfiler on `state` with a fake timing that counts its runs."""

    def __init__(self, models: Path, state: Path, backend: dict | None = None,
                 log: EventLogger | None = None) -> None:
        self.runs: list[str] = []

        def run(model_dir: Path, out: Path) -> dict:
            self.runs.append(model_dir.name)
            return TIMED

        self.p = compute.ComputeProfiler(ModelsFolder(models), state, log or EventLogger("test"), run=run,
                                         load=lambda: (0.1, 2), sleep=lambda s: None, tries=1,
                                         backend=lambda: dict(backend or BACKEND))

    def time(self, model_id: str):
        status = self.p.start(model_id)
        deadline = time.monotonic() + 10
        while status.state == "running":
            assert time.monotonic() < deadline
            time.sleep(0.01)
            status = self.p.status(model_id)
        assert status.state == "done", status.error
        return status.profile


def test_a_model_of_the_same_shapes_gets_the_timing_of_another_at_once(models, tmp_path):
    node = Profiler(models, tmp_path / "state")
    assert node.time("base").reused_from == ""
    assert node.p.status("fine-tune").state == "done"  # no timing started
    profile = node.time("fine-tune")
    assert node.runs == ["base"]
    assert (profile.model_id, profile.reused_from, profile.layer_ms_b1, profile.layers_timed) == \
        ("fine-tune", "base", 1.0, 2)
    assert {p.model_id for p in node.p.profiles()} == {"base", "fine-tune"}  # the report lists both


def test_the_reuse_survives_a_restart_of_the_agent(models, tmp_path):
    Profiler(models, tmp_path / "state").time("base")
    again = Profiler(models, tmp_path / "state")
    assert again.time("fine-tune").reused_from == "base" and again.runs == []


@pytest.mark.parametrize("other", ["wider", "half"])  # another shape; another dtype
def test_a_model_of_other_shapes_or_dtype_is_timed(models, tmp_path, other):
    node = Profiler(models, tmp_path / "state")
    node.time("base")
    assert node.p.status(other).state == "absent"
    assert node.time(other).reused_from == "" and node.runs == ["base", other]


def test_other_heads_over_the_same_weights_are_timed(models, tmp_path):
    node = Profiler(models, tmp_path / "state")
    node.time("base")
    config = json.loads((models / "fine-tune" / "config.json").read_text())
    (models / "fine-tune" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 2,
                                                                   "head_dim": 32}))
    assert node.p.status("fine-tune").state == "absent"


def test_another_backend_times_every_model_again(models, tmp_path):
    Profiler(models, tmp_path / "state").time("base")
    other = Profiler(models, tmp_path / "state", backend={**BACKEND, "threads": [2, 2]})
    assert other.p.status("base").state == "absent" and other.p.status("fine-tune").state == "absent"
    assert other.time("fine-tune").reused_from == "" and other.runs == ["fine-tune"]
    assert other.time("base").reused_from == "fine-tune"


class SlowToLog(EventLogger):
    """Widens the moment between a run keeping its profile and its end (the log line between)."""

    def info(self, event: str, **fields: object) -> None:
        if event == "compute.profiled":
            time.sleep(0.3)
        super().info(event, **fields)


def test_a_timing_seen_done_never_answers_the_next_one_busy(models, tmp_path):
    """Found in CI under load: a caller polling until "done" started the next model's timing
    and was told "busy timing base", the ended run not yet marked ended."""
    node = Profiler(models, tmp_path / "state", log=SlowToLog("test"))
    node.time("base")
    assert node.p.start("wider").state in ("running", "done")
