"""Speculative decoding on the stages: verification of drafted tokens in one pass, and rollback.

The coordinator sends a request's last accepted token followed by k drafted tokens as one FORWARD
chunk (and the drafts themselves in a DRAFT frame, so the last stage, which sees only hidden states,
knows them). Every stage runs the k+1 positions like a prefill chunk. The last stage then walks the
positions in order with the request's own sampler — processors, grammar-free sampling chain, PRNG
key — exactly as k+1 plain decode steps would: sample position i, and go on to position i+1 only
while the sample equals draft i. The emitted tokens are therefore the ones plain decoding samples
(greedy: the argmax; seeded sampling: the very draw, key for key), so the target distribution is
preserved trivially — the rule is "accept while the draft equals the request's own sample".

The caches now hold k+1 positions, of which only the accepted ones (plus the last accepted token's
input) are valid. No stage is told the outcome: the request's next FORWARD frame (or its CLOSE)
carries the position it continues from, lower than the stage's, and the stage rolls its caches back
(rewind.py: mlx-lm's own `trim` for plain KV; a rewind point and a replay of the accepted positions
for recurrent states, sliding windows and chunked attention). That is only allowed right after a
verification chunk and no further back than its first position + 1, so a confused coordinator cannot
rewind a request. A family whose chunked forward is not its step-by-step forward (PLaMo 3,
support.STEPWISE) runs the chunk one position at a time (rewind.Rewind.forward); one that cannot verify
exactly at all would refuse (`StageModel.speculation_refusal`; none does).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from orchestrator.engine.wire import Flag, Frame, Kind

MAX_DRAFT = 16  # drafted tokens one pass may carry


def parse_draft(payload: Any, vocab: int) -> list[int]:
    """A DRAFT frame's JSON ({"tokens": [ids]}) -> the token ids; ValueError when malformed."""
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(tokens, list) or not 0 < len(tokens) <= MAX_DRAFT:
        raise ValueError(f"a draft is a list of 1 to {MAX_DRAFT} token ids")
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in tokens):
        raise ValueError("draft token ids out of range")
    return list(tokens)


def verify(sampler: Any, logits: mx.array, draft: list[int]) -> list[tuple[int, float, mx.array]]:
    """Walk the k+1 positions of a verification chunk's logits [1, k+1, V] with the request's own
    sampler: sample each in turn, stop after the first sample that differs from its draft (or after
    the last position). Returns (token, its log-prob, processed log-probs [1, V]) per emitted token;
    the sampler has accepted each of them, as plain decode steps would have."""
    out: list[tuple[int, float, mx.array]] = []
    mx.eval(logits)  # once: each position's evaluation below must not recompute the chunk's graph
    for i in range(len(draft) + 1):
        lp = sampler.logprobs(logits[:, i:i + 1, :])
        token, logprob = sampler.pick(lp)
        mx.eval(token, logprob, lp)
        chosen = int(token.item())
        sampler.accept(chosen)
        out.append((chosen, logprob.item(), lp))
        if i == len(draft) or chosen != draft[i]:
            break
    return out


def verified(request_id: int, start: int, sampler: Any, logits: mx.array, draft: list[int]) -> list[Frame]:
    """The RESULT frames of a verification chunk that starts at position `start` (logits [1, k+1, V]): the
    accepted drafts plus one, all but the last flagged RUN. ValueError when the chunk does not fit
    the draft, or the sampler refuses."""
    width = int(logits.shape[1])
    if width != len(draft) + 1:
        raise ValueError(f"a chunk of {width} tokens cannot verify {len(draft)} drafts")
    emitted = verify(sampler, logits, draft)
    return [Frame(Kind.RESULT, request_id, start + i + 1, flags=Flag.RUN if i < len(emitted) - 1 else Flag.NONE,
                  payload=sampler.encode(token, logprob, lp)) for i, (token, logprob, lp) in enumerate(emitted)]


__all__ = ["MAX_DRAFT", "parse_draft", "verified", "verify"]
