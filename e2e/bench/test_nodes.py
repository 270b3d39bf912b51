"""`make bench` cannot silently rot: its --smoke mode runs every system (one node, pipeserve's 2
pinned stages, mlx-lm's pipeline) on a tiny qwen2 model, and the report names every target.
No measured figure is asserted: only that each was measured and judged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.bench.nodes_cli import main
from e2e.bench.nodes_report import verdict
from e2e.bench.pinning import affinity, descendants, pin

TARGETS = ("long-prompt TTFT", "long-prompt TTFT (64 tokens) ≤ 0.6 × one node, pipelined prefill",
           "decode at 1 request", "aggregate at 4 (short answers", "aggregate at 8 (short answers",
           "aggregate at 4 (short answers after real prompts) ≥ 1.5 × one node's batched, pipelined prefill",
           "aggregate at 4, long answers", "aggregate at 8, long answers", "÷ mlx-lm's pipeline at 1 request",
           "÷ mlx-lm's pipeline at 4 requests", "÷ mlx-lm's pipeline at 8 requests", "the plan's predicted")


def test_a_verdict_is_taken_on_the_median_and_says_when_rounds_disagree():
    assert verdict([1.0, 1.2, 0.9], lambda v: v >= 0.95) == "**met** (rounds on both sides)"
    assert verdict([0.5, 0.55], lambda v: v <= 0.6) == "**met**"
    assert verdict([], lambda v: True) == "n/a"


def test_pinning_covers_every_thread_of_a_process_tree():
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); print(1, flush=True)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # its second thread runs
        core = max(os.sched_getaffinity(0))
        assert pin(child.pid, {core}) == 2
        assert affinity(child.pid) == {core}
        assert child.pid in descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="2 emulated nodes need 2 cores")
def test_the_smoke_run_measures_every_system_and_judges_every_target(tmp_path: Path):
    out, raw = tmp_path / "report.md", tmp_path / "raw.json"
    assert main(["--smoke", "--workdir", str(tmp_path / "w"), "--out", str(out), "--json", str(raw)]) == 0
    text = out.read_text()
    for target in TARGETS:
        assert f"| qwen2-tiny | {target}" in text, target
    run = json.loads(raw.read_text())[0]
    assert set(run["results"]) == {"node", "pipeserve", "pipelined", "mlxpipe"}
    assert set(run["results"]["pipelined"]) == {"ttft", "agg4", "agg8"}  # its decode is the default's: not twice
    assert all(len(v) == 1 for metrics in run["results"].values() for v in metrics.values())
    assert run["blas"] == {"node": "OpenBLAS", "pipeserve": "OpenBLAS", "pipelined": "OpenBLAS", "mlxpipe": "OpenBLAS"}
    assert "stage-1: [" in run["pinning"]["pipeserve"]
    # the plan's prediction was made from the layers timed on one core, and set beside the measurements
    assert set(run["prediction"]["figures"]) == {"decode1", "long4", "long8", "ttft", "ttft_pipelined"}
    assert all(v > 0 for v in run["prediction"]["figures"].values())
    row = next(line for line in text.splitlines() if "the plan's predicted" in line)
    assert " of 5 within (measured median / predicted: decode ×1 " in row
    assert row.endswith(("**met** |", "**missed** |"))


def _states(pids: list[int]) -> set[str]:
    """The scheduler states (R, S, T, ...) of the processes' threads."""
    out = set()
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                out.add(stat.read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
    return out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="2 emulated nodes need 2 cores")
def test_mlx_lm_pipeline_takes_no_core_while_another_system_is_measured(tmp_path: Path):
    """Its idle rank busy-polls the ring and its launcher spins forwarding output: left running, they
    slowed every other system measured beside them (a bench once halved one node's decode that way)."""
    from e2e.bench.node_systems import MlxPipeline
    from e2e.bench.nodes_cli import prepare
    from e2e.bench.pinning import node_cores

    system = MlxPipeline(prepare("qwen2-tiny"), "qwen2-tiny", node_cores(2), tmp_path)
    try:
        pids = system.pids()
        assert len(system.ranks()) == 2 and system.proc.pid in pids
        system.idle()
        deadline = time.monotonic() + 10
        while _states(pids) != {"T"} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _states(pids) == {"T"}, "every thread of the launcher and the ranks is stopped"
        system.active()
        assert "T" not in _states(pids)
    finally:
        system.stop()


def test_a_models_end_tokens_are_gathered_as_mlx_lm_gathers_them(tmp_path: Path):
    from e2e.bench.node_models import end_tokens, prepare

    model = tmp_path / "m"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((prepare("qwen2-tiny") / name).read_text())
    (model / "config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert end_tokens(model) == [2, 7, 9]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="2 emulated nodes need 2 cores")
def test_every_system_honours_the_bias_that_makes_answers_run_their_length(tmp_path: Path):
    """The bench asks every answer to run to its length with a bias against the end tokens: a server
    that ignored it would end answers at random and measure fewer requests than the metric names."""
    from e2e.bench.measure import balanced_split
    from e2e.bench.node_models import end_tokens
    from e2e.bench.node_systems import MlxPipeline, OneNode, Pipeserve
    from e2e.bench.nodes_cli import prepare
    from e2e.bench.openai_client import complete, cut_short
    from e2e.bench.pinning import node_cores

    model, cores = prepare("qwen2-tiny"), node_cores(2)
    (end,) = end_tokens(model)
    systems = []
    try:
        systems.append(OneNode(model, "qwen2-tiny", cores[0], tmp_path))
        systems.append(Pipeserve(model, "qwen2-tiny", cores, tmp_path / "p", balanced_split(
            json.loads((model / "config.json").read_text()))))
        systems.append(MlxPipeline(model, "qwen2-tiny", cores, tmp_path))
        for s in systems:
            s.active()
            ended = complete(s.port, s.model_name, "Hello there", 8, s.host, logit_bias={end: 100.0})
            assert (ended.finish, cut_short([ended], 8)) == ("stop", 1), s.label
            full = complete(s.port, s.model_name, "Hello there", 8, s.host, logit_bias={end: -100.0})
            assert (full.finish, full.tokens) == ("length", 8), s.label
            s.idle()
    finally:
        for s in systems:
            s.stop()
