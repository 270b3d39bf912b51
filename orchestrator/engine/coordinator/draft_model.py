"""A draft model on the coordinator: a small model with the target's tokenizer drafts greedily.

The coordinator's scheduler thread owns it (the only thread of the coordinator that runs MLX).
Per request it keeps the draft model's cache and the tokens that cache has seen. A draft first
cuts the cache back to the longest prefix those tokens share with the request's sequence now
(what the last verification accepted: mlx-lm's own `trim`), feeds the rest, then decodes k tokens
greedily. A long catch-up (a new request's prompt) goes CATCH_UP tokens per call, with no draft until
it is done: the scheduler runs the draft model between the pipeline's steps and must not stall them
for a whole prompt. A draft is a deterministic function of the sequence, so the stages' verification
(greedy, or the seeded rule of docs/speculation.md) is unchanged: the output is the target's own.

Only a model whose caches trim exactly can draft (plain or quantized KV caches); a different
tokenizer is refused at load, since its token ids would mean other words.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATCH_UP = 64  # the most tokens the draft model catches up in one call (a prompt: over several steps)


class DraftModelError(ValueError):
    """The draft model cannot draft for this target (missing, another tokenizer, caches that cannot trim)."""


def vocabulary(model_dir: Path) -> dict[str, int]:
    """The token -> id map of a model directory's tokenizer.json (added tokens included)."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DraftModelError(f"{path}: cannot read the tokenizer ({exc})") from None
    vocab = dict((data.get("model") or {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens") or [] if "content" in t and "id" in t})
    if not vocab:
        raise DraftModelError(f"{path}: no vocabulary")
    return vocab


def check_same_tokenizer(target_dir: Path, draft_dir: Path) -> None:
    """Raise DraftModelError unless the two models map every token to the same id."""
    target, draft = vocabulary(target_dir), vocabulary(draft_dir)
    if target != draft:
        differ = sorted(set(target.items()) ^ set(draft.items()))[:3]
        raise DraftModelError(f"the draft model {draft_dir} has another tokenizer than the served model "
                              f"({len(draft)} vs {len(target)} tokens; e.g. {differ})")


@dataclass
class _Request:
    cache: list[Any]
    seen: list[int] = field(default_factory=list)  # the tokens the cache holds, in order


class DraftModel:
    """A loaded draft model and one cache per request (the least recently drafting dropped past
    `max_requests`)."""

    def __init__(self, model_dir: Path, target_dir: Path | None = None, max_requests: int = 64) -> None:
        from mlx.utils import tree_flatten
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model

        from orchestrator.engine.stage.rewind import trims

        if target_dir is not None:
            check_same_tokenizer(target_dir, model_dir)
        try:
            self.model, _ = load_model(Path(model_dir))
        except (OSError, ValueError) as exc:
            raise DraftModelError(f"cannot load the draft model {model_dir}: {exc}") from None
        if not trims(make_prompt_cache(self.model)):  # it rolls back by trimming its own cache
            raise DraftModelError(f"the draft model {model_dir} keeps caches that cannot roll back "
                                  "(a recurrent state or a sliding window): it cannot follow verification")
        self._make_cache = lambda: make_prompt_cache(self.model)
        self.weight_bytes = sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))
        self.max_requests = max_requests
        self._requests: OrderedDict[int, _Request] = OrderedDict()

    def draft(self, request: int, sequence: list[int], k: int) -> list[int]:
        """The k tokens the draft model decodes greedily after `sequence` (a request's prompt and
        output so far)."""
        import mlx.core as mx

        if k <= 0 or not sequence:
            return []
        state = self._requests.pop(request, None) or _Request(self._make_cache())
        self._requests[request] = state
        while len(self._requests) > self.max_requests:
            self._requests.popitem(last=False)
        common = _common_prefix(state.seen, sequence)
        if common == len(sequence):  # the cache must still compute the last token's logits
            common -= 1
        excess = len(state.seen) - common
        if excess:
            for c in state.cache:
                c.trim(excess)
        state.seen = state.seen[:common]
        pending, out = sequence[common:], []
        if len(pending) > CATCH_UP:
            # A long catch-up (the prompt): one chunk per call, no draft yet. The scheduler thread runs
            # this between the pipeline's steps, so it never stalls them for a whole prompt.
            self.model(mx.array(pending[:CATCH_UP])[None], cache=state.cache)
            mx.eval([c.state for c in state.cache])
            state.seen.extend(pending[:CATCH_UP])
            return []
        while len(out) < k:
            logits = self.model(mx.array(pending)[None], cache=state.cache)[:, -1, :]
            state.seen.extend(pending)
            token = int(mx.argmax(logits, axis=-1).item())
            out.append(token)
            pending = [token]
        return out

    def forget(self, request: int) -> None:
        """Drop a finished request's cache."""
        self._requests.pop(request, None)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


