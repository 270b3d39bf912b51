"""Speculative decoding through real stages: greedy with speculation equals greedy mlx-lm, token for token.

Stages are real processes; the coordinator's scheduler runs in the test process (harness.InTestCoordinator).
A random test model never repeats its context, so prompt lookup would draft nothing it accepts: the drafts
come from an oracle (`Speculation.draft_source`) that knows the reference answer and spoils one drafted token
of most passes, so that passes accept all, some and none of their drafts (prompt lookup itself is tested in
tests/engine/coordinator/test_drafting.py, and measured on a real model by e2e/bench/speculation.py).
Log-probs are not compared bit for bit: a verification chunk scores k+1 positions in one matmul, whose
low bits may differ from k+1 single-position steps.
Each runs on three models: the llama test model (plain KV: stages roll back by trimming), Qwen3-Next (linear
attention states beside KV) and Gemma 3 (sliding windows that the 28-token prompts overflow), whose stages
roll back through a rewind point and a replay (engine/stage/rewind.py) — with the prompt cache on, so the
entries a request leaves when it ends inside an accepted run are checked by the requests that start from them.
Then the comparison is shown to bite: a stage that moves its position back without rolling its caches back
(`spec-skip-trim`) fails it. PLaMo 3 (verified one position at a time) and DeepSeek-V4.1 (boundaries cut by
compressed group in a replay) speculate through real stages too.
"""

from __future__ import annotations

import pytest
import requests

from orchestrator.engine.coordinator.pipeline import GenerationParams
from orchestrator.engine.stage.shard import ModelInfo
from orchestrator.proc import wait_until
from tests.support.engine_harness import InTestCoordinator, reference

REPEAT = [5, 17, 101, 33, 7, 250, 9] * 4
CODE = [(i * 13 + 5) % 300 for i in range(24)] * 2 + [(i * 13 + 5) % 300 for i in range(6)]
PROMPTS = [REPEAT, CODE, [9, 8, 7]]
TOKENS = 40


def _metric(coord: InTestCoordinator, name: str) -> int:
    """One counter of the coordinator's /metrics."""
    return int(coord.metric(name))


def _spec_counts(coord: InTestCoordinator) -> tuple[int, int, int]:
    return tuple(_metric(coord, f"pipeserve_spec_{n}_total") for n in ("passes", "drafted_tokens", "accepted_tokens"))


def _oracle(want: dict[tuple[int, ...], list[int]]):
    """Drafts from the reference answer; in most passes one drafted token is wrong (which depends on
    how far the answer is)."""
    def draft(sequence: list[int], k: int) -> list[int]:
        prompt = next(p for p in want if tuple(sequence[:len(p)]) == p and len(sequence) - len(p) <= len(want[p]))
        done = len(sequence) - len(prompt)
        out = list(want[prompt][done:done + k])
        wrong = done % (k + 2)
        if wrong < len(out):
            out[wrong] = (out[wrong] + 1) % 500
        return out

    return draft


def _coordinator(cluster, want, eos=None) -> InTestCoordinator:
    coord = InTestCoordinator(cluster, eos=eos)
    coord.pipeline.speculation.draft_source = _oracle(want)
    coord.pipeline.speculation.alone_only = False  # steps that mix speculating and plain requests too
    return coord


def _ready(coord: InTestCoordinator) -> None:
    """Ready, and every stage's PONG has said its caches roll back: drafting starts only then (the
    first PONGs come up to 0.5 s after the probe, and a loaded machine finishes short answers sooner)."""
    coord.wait_ready()
    coord.stage_stats(lambda stats: all(s.get("speculation") for s in stats))


def _tokens(coord: InTestCoordinator, prompt: list[int], max_tokens: int) -> list[int]:
    return coord.run(prompt, max_tokens).tokens


@pytest.fixture(scope="module", params=["llama", "qwen3_next", "gemma3_text"])
def expected(request, model_factory, family_model):
    """(model, the reference answer per prompt, two stages' inclusive layer ranges)."""
    model = model_factory() if request.param == "llama" else family_model(request.param)
    n = ModelInfo.read(model).num_layers
    splits = [(0, n // 2 - 1), (n // 2, n - 1)]
    want = {tuple(p): reference(model, p, TOKENS, prefill_step=16).tokens for p in PROMPTS}
    turn = _turn(want)  # the next turn of REPEAT's conversation: starts from the entry REPEAT's answer left
    want[tuple(turn)] = reference(model, turn, TOKENS, prefill_step=16).tokens
    return model, want, splits


def _turn(want: dict[tuple[int, ...], list[int]]) -> list[int]:
    return [*REPEAT, *want[tuple(REPEAT)], 3, 4]


def test_greedy_with_speculation_equals_mlx_lm(launch, expected):
    model, want, splits = expected
    cluster = launch(model, splits, coordinator=False, prefill_step_size=16, speculative_tokens=4)
    coord = _coordinator(cluster, want)
    try:
        _ready(coord)
        for prompt in [*PROMPTS, _turn(want)]:
            assert _tokens(coord, prompt, TOKENS) == want[tuple(prompt)], f"prompt {prompt[:8]}..."
        hits = _metric(coord, "pipeserve_prompt_cache_hits_total")
        passes, drafted, accepted = _spec_counts(coord)
        # max_tokens falling inside an accepted run: every shorter answer is the reference's prefix
        for n in (1, 2, 3, 5, 8, 13):
            assert _tokens(coord, REPEAT, n) == want[tuple(REPEAT)][:n], f"max_tokens={n}"
        # concurrent requests, speculating and not, micro-batched in the same steps
        gens = [coord.generate(p, TOKENS) for p in PROMPTS + PROMPTS]
        for p, gen in zip(PROMPTS + PROMPTS, gens):
            assert coord.collect(gen).tokens == want[tuple(p)]
    finally:
        coord.stop()
    assert passes > 0 and drafted > accepted > 0, f"no speculation happened: {passes, drafted, accepted}"
    assert hits > 0, "the next turn did not start from the prompt cache"


def test_a_stop_token_inside_an_accepted_run(launch, expected):
    model, want, splits = expected
    ref = want[tuple(REPEAT)]
    stop = ref[10]  # a token the answer produces somewhere in the middle
    cluster = launch(model, splits, coordinator=False, prefill_step_size=16, speculative_tokens=4)
    coord = _coordinator(cluster, want, eos={stop})
    try:
        _ready(coord)
        got = _tokens(coord, REPEAT, TOKENS)
    finally:
        coord.stop()
    assert got == ref[:ref.index(stop) + 1]


def test_off_decodes_plainly(launch, expected):
    model, want, splits = expected
    cluster = launch(model, splits, coordinator=False, prefill_step_size=16, speculative_tokens=0)
    coord = _coordinator(cluster, want)
    try:
        coord.wait_ready()
        assert _tokens(coord, REPEAT, TOKENS) == want[tuple(REPEAT)]
        assert _spec_counts(coord) == (0, 0, 0)
    finally:
        coord.stop()


def test_a_stage_that_skips_the_trim_fails_the_comparison(launch, expected):
    model, want, splits = expected
    cluster = launch(model, splits, coordinator=False, prefill_step_size=16, speculative_tokens=4,
                     env={"PIPESERVE_FAULTS": "stage-1:spec-skip-trim"})
    coord = _coordinator(cluster, want)
    try:
        _ready(coord)
        got = [coord.collect(coord.pipeline.submit(p, GenerationParams(max_tokens=TOKENS))).tokens for p in PROMPTS]
        passes, drafted, accepted = _spec_counts(coord)
    finally:
        coord.stop()
    assert drafted > accepted, f"no draft was rejected, so nothing was rolled back: {passes, drafted, accepted}"
    assert got != [want[tuple(p)] for p in PROMPTS]


def test_health_reports_the_passes_prompt_lookup_verified(launch, expected):
    """A real coordinator drafting by prompt lookup (no oracle): GET /health carries its speculation
    counts, the ones /metrics gives and the dashboard's last stage card shows; without speculation,
    none."""
    model, _, splits = expected
    cluster = launch(model, splits, prefill_step_size=16, speculative_tokens=4)
    plain = launch(model, splits, prefill_step_size=16)
    for c in (cluster, plain):
        c.wait_ready()
    # drafting starts once every stage's PONG said its caches roll back
    wait_until(lambda: all(s.get("speculation") for s in requests.get(cluster.base_url + "/health", timeout=5)
                           .json()["stages"]), 30, message="the stages' PONGs saying they can speculate")
    served = requests.get(cluster.base_url + "/v1/models", timeout=5).json()["data"][0]["id"]
    body = {"model": served, "prompt": REPEAT, "max_tokens": TOKENS, "temperature": 0}
    answer = requests.post(cluster.base_url + "/v1/completions", json=body, timeout=120).json()
    health = requests.get(cluster.base_url + "/health", timeout=5).json()
    metrics = {line.split()[0]: float(line.split()[1]) for line in
               requests.get(cluster.base_url + "/metrics", timeout=5).text.splitlines()
               if line.startswith("pipeserve_spec_") and line.split()[0].endswith("_total")}
    spec = health["speculation"]
    assert answer.get("usage", {}).get("completion_tokens", 0) > 0, answer
    assert spec["max_drafts"] == 4 and not spec["refused"], spec
    assert spec["passes"] > 0 and spec["drafted"] >= spec["passes"], spec
    assert (spec["passes"], spec["drafted"], spec["accepted"]) == (
        metrics["pipeserve_spec_passes_total"], metrics["pipeserve_spec_drafted_tokens_total"],
        metrics["pipeserve_spec_accepted_tokens_total"])
    assert requests.get(plain.base_url + "/health", timeout=5).json()["speculation"] is None


@pytest.mark.parametrize("family", ["plamo3", "deepseek_v41"])
def test_a_stepwise_family_and_a_grouped_boundary_speculate_exactly(launch, family_model, family):
    """PLaMo 3's stages verify and replay one position at a time (support.STEPWISE; their stats say so) and
    DeepSeek-V4.1's cut what crosses a boundary by compressed group in a replay: through real stages, every
    answer equals mlx-lm's, alone, ending inside accepted runs and micro-batched, with passes rolled back."""
    model = family_model(family)
    n = ModelInfo.read(model).num_layers
    want = {tuple(p): reference(model, p, TOKENS, prefill_step=16).tokens for p in PROMPTS}
    cluster = launch(model, [(0, n // 2 - 1), (n // 2, n - 1)], coordinator=False, prefill_step_size=16,
                     speculative_tokens=4)
    coord = _coordinator(cluster, want)
    try:
        _ready(coord)
        stats = coord.stage_stats(lambda got: all("rollback" in s for s in got))
        assert [s.get("verification") for s in stats] == ["stepwise" if family == "plamo3" else None] * 2, stats
        assert all(s["rollback"] == "replay" and "speculation_refused" not in s for s in stats), stats
        for prompt in PROMPTS:
            assert _tokens(coord, prompt, TOKENS) == want[tuple(prompt)], f"prompt {prompt[:8]}..."
        for k in (1, 2, 3, 5, 8):
            assert _tokens(coord, REPEAT, k) == want[tuple(REPEAT)][:k], f"max_tokens={k}"
        gens = [coord.generate(p, TOKENS) for p in PROMPTS + PROMPTS]
        for p, gen in zip(PROMPTS + PROMPTS, gens):
            assert coord.collect(gen).tokens == want[tuple(p)]
        passes, drafted, accepted = _spec_counts(coord)
    finally:
        coord.stop()
    assert passes > 0 and drafted > accepted > 0, f"nothing was rolled back: {passes, drafted, accepted}"
