"""The exactness matrix's speculation rows: greedy with verification passes equals greedy mlx-lm, per family.

For every family a two-stage split runs the stages' own speculation code in process (speculate.verify on the
last stage with a greedy `Sampler`; on every stage rewind.Rewind around each forward and for each rollback, as
Stage does) with drafts from an oracle that knows the reference answer and spoils one token of most passes, so
passes accept all, some or none of their drafts. The tokens must equal a cold `generate_step` run. Families
whose caches trim roll back with mlx-lm's `trim`; the others (a recurrent state, a sliding window, chunked
attention) through a rewind point and a replay of the accepted positions. Then the comparison is shown to
bite, both ways: a stage that skips the rollback fails it.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from orchestrator.engine.stage.rewind import Rewind, output, rollback_of, trims
from orchestrator.engine.stage.sampling import Sampler
from orchestrator.engine.stage.shard import StageModel
from orchestrator.engine.stage.speculate import verify
from orchestrator.testmodels.families import FAMILIES
from tests.engine.harness import reference, two_stages

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
CHUNK = 16
TOKENS = 14
DRAFT = 4
NAMES = sorted(FAMILIES)


def speculate(stages: list[StageModel], prompt: list[int], answer: list[int], skip_trim: bool = False) -> list[int]:
    """Greedy generation of len(answer) tokens through `stages`, verifying oracle drafts each pass."""
    caches = [s.make_cache() for s in stages]
    rewinds = [Rewind(rollback_of(c)) for c in caches]
    held = [0] * len(stages)  # the position each stage's caches hold
    sampler = Sampler()

    def through(tokens: list[int], at: int, verifying: bool = False) -> mx.array:
        x = mx.array(tokens)[None]
        for i, (s, c, r) in enumerate(zip(stages, caches, rewinds)):
            x, held[i], drop = r.prepare(c, held[i], x, verifying, s.forward)
            held[i] += int(x.shape[1])
            x = output(s.forward(x, c), drop)
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
        emitted = [t for t, _ in verify(sampler, logits, draft)]
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
    stages = two_stages(model)
    refusal = next((s.speculation_refusal for s in stages if s.speculation_refusal), None)
    if refusal:
        pytest.skip(f"{family}: its stages refuse speculation ({refusal})")
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(stages, PROMPT, want) == want


def test_which_families_roll_back_by_trim(family_model):
    """Plain KV families trim; recurrent states, windows and chunks replay (docs/speculation.md)."""
    replay = sorted(f for f in NAMES if not trims(StageModel(family_model(f), 0, 1).make_cache()))
    assert "llama" not in replay and "qwen3" not in replay
    for family in ("falcon_h1", "jamba", "qwen3_next", "gemma3_text", "mistral", "mamba2", "rwkv7"):
        if family in FAMILIES:
            assert family in replay, f"{family} cannot trim"


def test_which_families_refuse_speculation_when_split(family_model):
    """DeepSeek-V4.1: its windows cannot trim, and its boundaries carry state per compressed group, not
    per position, so a replay cannot be joined to the next input. PLaMo 3: its chunks are not its steps
    (test_plamo3_chunks_are_not_its_steps). Every other family's stages verify."""
    refused = sorted(f for f in NAMES if any(s.speculation_refusal for s in two_stages(family_model(f))))
    assert refused == ["deepseek_v41", "plamo3"]


def test_plamo3_chunks_are_not_its_steps(family_model):
    """Why PLaMo 3 refuses: mlx-lm's own model, in one process, gives other logits for ten positions run
    as one chunk than as ten decode steps once the prompt overflows its window (the mask's window + 1)."""
    from mlx_lm.utils import load_model

    model, _ = load_model(family_model("plamo3"))

    def logits(sizes: list[int]) -> mx.array:
        cache, at, out = model.make_cache(), 0, []
        for n in sizes:
            out.append(model(mx.array(PROMPT[at:at + n])[None], cache=cache)[0])
            at += n
        return mx.concatenate(out)[-10:]

    assert mx.abs(logits([30] + [1] * 10) - logits([30, 10])).max().item() > 1e-2


@pytest.mark.parametrize("family", ["llama", "mamba2", "gemma3_text"])  # trim; a recurrent state; windows
def test_the_comparison_detects_a_stage_that_skips_the_rollback(family_model, family):
    model = family_model(family)
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want
    assert speculate(two_stages(model), PROMPT, want, skip_trim=True) != want


@pytest.mark.parametrize("family", ["qwen3_next", "gemma3_text", "rwkv7", "llama4"])  # states, windows, chunks
def test_replays_run_on_their_own_past_the_limit(family_model, family, monkeypatch):
    """Every replay longer than REPLAY_MAX runs as a forward of its own before the next verification
    chunk (with a limit of 3, each one does): the tokens are still mlx-lm's."""
    from orchestrator.engine.stage import rewind

    monkeypatch.setattr(rewind, "REPLAY_MAX", 3)
    model = family_model(family)
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want
