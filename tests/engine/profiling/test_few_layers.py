"""A per-layer figure from a few layers stands for all of them (engine/profiling/layers.py with
families/layer_kinds.py): the body timed the profile's way (the run `body_plan` picks, each step
behind a read of the untimed layers' bytes) agrees with the body timed whole (`--all-layers`).

No wall-clock ceiling: the two are timed in interleaved rounds on the same machine, each key's
best round kept (a load spike only ever adds), and compared with the tolerance the busy-machine
rule (agent/timing_doubt.py) allows between two rounds of one step. On a machine that rule
finds busy (its load), short steps escape the other work more often than long ones (few layers
came out 0.62x all of them at load 6 on 2 cores): after ATTEMPTS tries the test is skipped with
the figures there, as a doubted timing is shown with its doubt; on a quiet one it fails. A
ratio beyond GROSS fails anywhere (a wrong count of layers divides by 3.5 here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.perf_schemas import ComputeProfile
from orchestrator.agent.timing_doubt import SPREAD_LIMIT, timing_doubt
from orchestrator.engine.profiling import layers
from orchestrator.engine.stage.shard import StageModel, read_config
from orchestrator.families import support

LAYERS = 8  # a body of 7: two timed, five read instead
ROUNDS = 3
ATTEMPTS = 3
KEYS = ("b1_solo", "b1", "bB")  # one request alone, beside others, and a batch
GROSS = 3.0  # a ratio beyond this (either way) fails on any machine (2.x seen at load 7 on 2 cores)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from orchestrator.testmodels.llama import make_test_model

    # layers of ~4.7 MB: two fit in this machine's 32 MiB L3, seven do not (what the read is for)
    return make_test_model(tmp_path_factory.mktemp("m") / "l8", layers=LAYERS, hidden=256, heads=4, kv_heads=2)


def _ratios(model: Path) -> dict[str, float]:
    """Best-of-ROUNDS per-layer ms, few layers (the profile's plan) / all, per key."""
    timed, untimed = layers.body_plan(model, LAYERS, 64, support.shared_kv_cuts(read_config(model)), False)
    assert timed == 2 and untimed > 0
    few, every = StageModel(model, 0, timed), StageModel(model, 0, LAYERS - 1)
    sweep = layers._sweep(min(untimed, layers.sweep_limit()))
    best: dict[str, dict[str, float]] = {"few": {}, "all": {}}
    for _ in range(ROUNDS):
        for name, got in (("few", layers.time_body(few, timed, 8, lambda solo: None, sweep)),
                          ("all", layers.time_body(every, LAYERS - 1, 8, lambda solo: None))):
            for k in KEYS:
                best[name][k] = min(best[name].get(k, got[k]), got[k])
    return {k: best["few"][k] / best["all"][k] for k in KEYS}


def _busy() -> str:
    """The busy-machine rule's load reason now ("" on a quiet machine)."""
    return timing_doubt(layer_ms_b1=1.0, load=os.getloadavg()[0], cpus=os.cpu_count() or 0)


def test_a_few_layers_per_layer_figure_agrees_with_all_of_them(model):
    seen, busy = [], ""
    for _ in range(ATTEMPTS):
        before = _busy()
        ratios = _ratios(model)
        seen.append({k: round(v, 3) for k, v in ratios.items()})
        if all(1 / (1 + SPREAD_LIMIT) <= r <= 1 + SPREAD_LIMIT for r in ratios.values()):
            return
        # no busy machine makes one layer's share of a step a third or three times what it is
        assert all(1 / GROSS <= r <= GROSS for r in ratios.values()), f"few / all layers per layer: {seen}"
        busy = before or _busy() or busy
    if busy:  # the rule doubts timings taken now: two of them may disagree this much
        pytest.skip(f"the machine is busy ({busy}): few / all layers per layer, per attempt: {seen}")
    pytest.fail(f"few / all layers per layer, per attempt, on a quiet machine: {seen} (allowed 1 ± {SPREAD_LIMIT})")


def test_the_profile_says_how_many_layers_it_timed(model, tmp_path):
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(model),
                    "--out", str(out), "--batch", "4", "--prefill-chunk", "32"], check=True, timeout=300)
    data = json.loads(out.read_text())
    assert data["layers_timed"] == 2
    assert ComputeProfile.model_validate({**data, "model_id": "m"}).layers_timed == 2  # the agent keeps it


def test_the_sweep_reads_at_most_twice_the_last_level_cache(tmp_path):
    for name, level, size in (("index0", "1", "48K"), ("index2", "2", "2048K"), ("index3", "3", "32768K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert layers.sweep_limit(tmp_path) == 2 * 32 << 20
    assert layers.sweep_limit(tmp_path / "absent") == layers.SWEEP_MAX_BYTES
    assert [layers.cache_bytes(s) for s in ("2M", "512", "x")] == [2 << 20, 512, 0]
