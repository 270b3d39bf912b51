"""The exactness matrix's speculation rows: greedy with verification passes equals greedy mlx-lm, per family.

For every family a two-stage split runs the stages' own speculation code in process (speculate.verify on the
last stage with a greedy `Sampler`; on every stage rewind.Rewind around each forward and for each rollback, as
Stage does) with drafts from an oracle that knows the reference answer and spoils one token of most passes, so
passes accept all, some or none of their drafts. The tokens must equal a cold `generate_step` run. Families
whose caches trim roll back with mlx-lm's `trim`; the others (a recurrent state, a sliding window, chunked
attention) through a rewind point and a replay of the accepted positions. PLaMo 3 runs its verification
chunks and replays one position at a time; DeepSeek-V4.1's replays cut what crosses its boundaries by
compressed group. Then the comparison is shown to bite: a stage that skips the rollback fails it, and
PLaMo 3's chunk is shown to differ from its steps.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from orchestrator.engine.stage.rewind import Rewind, rollback_for, trims
from orchestrator.engine.stage.sampling import Sampler
from orchestrator.engine.stage.shard import ModelInfo, StageModel
from orchestrator.engine.stage.speculate import verify
from orchestrator.testmodels.families import FAMILIES
from tests.support.engine_harness import reference, two_stages

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
CHUNK = 16
TOKENS = 14
DRAFT = 4
NAMES = sorted(FAMILIES)


def speculate(stages: list[StageModel], prompt: list[int], answer: list[int], skip_trim: bool = False) -> list[int]:
    """Greedy generation of len(answer) tokens through `stages`, verifying oracle drafts each pass."""
    caches = [s.make_cache() for s in stages]
    rewinds = [Rewind(rollback_for(s)) for s in stages]
    held = [0] * len(stages)  # the position each stage's caches hold
    sampler = Sampler()

    def through(tokens: list[int], at: int, verifying: bool = False) -> mx.array:
        x = mx.array(tokens)[None]
        for i, (s, c, r) in enumerate(zip(stages, caches, rewinds)):
            x, held[i] = r.prepare(c, held[i], x, verifying, s.forward)
            held[i] += int(x.shape[1])
            x = r.forward(s.forward, x, c)
            r.ran(at, verifying)
        return x

    for start in range(0, len(prompt) - 1, CHUNK):
        through(prompt[start:min(start + CHUNK, len(prompt) - 1)], start)
        mx.eval([c.state for cache in caches for c in cache])
    out, position, token = [], len(prompt) - 1, prompt[-1]
    while len(out) < len(answer):
        draft = list(answer[len(out):len(out) + min(DRAFT, len(answer) - len(out) - 1)])
        wrong = len(out) % (DRAFT + 2)
        if wrong < len(draft):
            draft[wrong] = (draft[wrong] + 1) % 500
        logits = through([token, *draft], position, verifying=bool(draft))
        emitted = [t for t, _, _ in verify(sampler, logits, draft)]
        end = position + len(draft) + 1
        for i, (c, r) in enumerate(zip(caches, rewinds)):  # every stage rolls back to what the pass accepted
            if position + len(emitted) < end:
                held[i] = r.back(c, held[i], position + len(emitted), skip_trim=skip_trim)
        out += emitted
        position, token = position + len(emitted), out[-1]
    return out[:len(answer)]


@pytest.mark.parametrize("family", NAMES)
def test_speculation_equals_mlx_lm(family_model, family):
    model = family_model(family)
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want


def test_which_families_roll_back_by_trim(family_model):
    """Plain KV families trim; recurrent states, windows and chunks replay (docs/speculation.md)."""
    replay = sorted(f for f in NAMES if not trims(StageModel(family_model(f), 0, 1).make_cache()))
    assert "llama" not in replay and "qwen3" not in replay
    for family in ("falcon_h1", "jamba", "qwen3_next", "gemma3_text", "mistral", "mamba2", "rwkv7", "plamo3",
                   "deepseek_v41"):
        if family in FAMILIES:
            assert family in replay, f"{family} cannot trim"


def test_every_family_speculates_and_plamo3_verifies_step_by_step(family_model):
    """No family's stages refuse speculation; PLaMo 3's verify one position at a time
    (test_plamo3_verifies_step_by_step), DeepSeek-V4.1's cut their boundaries by group too."""
    rollbacks = {f: [rollback_for(s) for s in two_stages(family_model(f))] for f in NAMES}
    assert sorted(f for f, r in rollbacks.items() if None in r) == []
    assert sorted(f for f, r in rollbacks.items() if any(x.stepwise for x in r)) == ["plamo3"]


def test_plamo3_verifies_step_by_step(family_model):
    """Why PLaMo 3 verifies stepwise: mlx-lm's own model gives other logits for ten positions run as one
    chunk than as ten decode steps once the prompt overflows its window (the mask's window + 1); its
    stage's verification chunk, run one position at a time, gives the decode steps' logits exactly."""
    from mlx_lm.utils import load_model

    path = family_model("plamo3")
    model, _ = load_model(path)
    stage = StageModel(path, 0, ModelInfo.read(path).num_layers)

    def prefilled(run) -> list:
        cache = stage.make_cache()
        mx.eval(run(mx.array(PROMPT[:30])[None], cache), [c.state for c in cache])
        return cache

    def steps() -> mx.array:
        cache = prefilled(model)
        return mx.concatenate([model(mx.array([[t]]), cache=cache) for t in PROMPT[30:40]], axis=1)

    chunk = mx.array(PROMPT[30:40])[None]
    chunked = model(chunk, cache=prefilled(model))
    cache, rewind = prefilled(stage.forward), Rewind(rollback_for(stage))
    x, _ = rewind.prepare(cache, 30, chunk, True, stage.forward)
    stepwise = rewind.forward(stage.forward, x, cache)
    assert mx.abs(chunked - steps()).max().item() > 1e-2
    assert mx.array_equal(stepwise, steps()).item()


def test_deepseek_v41_speculates_through_three_stages_and_a_short_prompt(family_model):
    """Every part its boundaries carry is cut by group in a replay: compressed K/V and index keys passed
    on through a middle stage (cuts at 2 and 4), and a prompt short enough that the picks' and the
    candidate flags' widths grow while it speculates."""
    model = family_model("deepseek_v41")
    stages = [StageModel(model, a, b) for a, b in ((0, 2), (2, 4), (4, 6))]
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(stages, PROMPT, want) == want
    short = PROMPT[:6]
    want = reference(model, short, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), short, want) == want
    assert speculate(stages, short, want) == want


# trim; a recurrent state; windows; windows verified stepwise; boundaries cut by group
@pytest.mark.parametrize("family", ["llama", "mamba2", "gemma3_text", "plamo3", "deepseek_v41"])
def test_the_comparison_detects_a_stage_that_skips_the_rollback(family_model, family):
    model = family_model(family)
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want
    assert speculate(two_stages(model), PROMPT, want, skip_trim=True) != want


# states, windows, chunks, windows verified stepwise, boundaries cut by group
@pytest.mark.parametrize("family", ["qwen3_next", "gemma3_text", "rwkv7", "llama4", "plamo3", "deepseek_v41"])
def test_replays_run_on_their_own_past_the_limit(family_model, family, monkeypatch):
    """Every replay longer than REPLAY_MAX runs as a forward of its own before the next verification
    chunk (with a limit of 3, each one does): the tokens are still mlx-lm's."""
    from orchestrator.engine.stage import rewind

    monkeypatch.setattr(rewind, "REPLAY_MAX", 3)
    model = family_model(family)
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want
