"""Prompt-lookup drafting on the coordinator: no extra model, only the request's own tokens.

A request's sequence (prompt, then what it generated) often repeats itself — code rewritten with one
change, a summary quoting its source, tool-call arguments echoing the context. `Lookup` keeps, for
every n-gram of length 1..`max_ngram`, the position that followed its latest occurrence; the draft is
the tokens that followed the latest earlier occurrence of the sequence's last n tokens (longest n
first, down to `min_ngram` = 2: a lone token seen before predicts little; replayed on the demo
model's answers, one-token matches allowed drafted 10 passes in 96 tokens of free chat, 2 of 16
drafts right; from two tokens 4 passes, and the code edit and tool-call echo gained, docs/benchmark.md).
`DraftLength` adapts how many tokens a request drafts from what its last passes accepted, down
to 0 (plain decoding) with a retry now and then, rarer after each one that accepted nothing (a failed
pass yields one token at the cost of a verification chunk: free chat over a LAN lost 9–25 % to retries
every 16 steps, docs/benchmark.md). Both are pure: the scheduler (pipeline.py) owns them,
one of each per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RETRY_AFTER = 16  # plain steps a request decodes at draft length 0 before it tries one token again...
MAX_RETRY_AFTER = 256  # ...doubled after each retry that accepted nothing (text that never repeats itself)


@dataclass
class Lookup:
    """An n-gram index over one request's growing token sequence."""

    max_ngram: int = 3
    tokens: list[int] = field(default_factory=list)
    follows: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    min_ngram: int = 2  # the shortest match that drafts

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError("n-gram lengths must satisfy 1 <= min_ngram <= max_ngram")
        self.follows = [{} for _ in range(self.max_ngram)]
        seed, self.tokens = self.tokens, []
        self.extend(seed)

    def extend(self, tokens: list[int]) -> None:
        """Append tokens; each n-gram that now has a follower points at it (the latest wins)."""
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens) - 1  # the new token follows the n-grams ending just before it
            for n in range(1, self.max_ngram + 1):
                if end - n >= 0:
                    self.follows[n - 1][tuple(self.tokens[end - n:end])] = end

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the last n tokens
        (n = max_ngram down to min_ngram); [] when none occurred before or k is 0."""
        if k <= 0:
            return []
        for n in range(min(self.max_ngram, len(self.tokens)), self.min_ngram - 1, -1):
            start = self.follows[n - 1].get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start:start + k]
        return []


@dataclass
class DraftLength:
    """How many tokens a request drafts next, from its acceptance so far (at most `maximum`)."""

    maximum: int
    k: int = -1
    plain: int = 0  # steps decoded since k reached 0
    wait: int = RETRY_AFTER  # plain steps before the next retry
    retrying: bool = False  # the pass in flight is a retry after plain decoding

    def __post_init__(self) -> None:
        if self.maximum < 0:
            raise ValueError("the draft length cannot be negative")
        if self.k < 0:
            self.k = self.maximum

    def next(self) -> int:
        """The draft length of this step (counts a plain step while at 0)."""
        if self.k == 0 and self.maximum:
            self.plain += 1
            if self.plain >= self.wait:
                self.k, self.plain, self.retrying = 1, 0, True
        return self.k

    def observe(self, drafted: int, accepted: int) -> None:
        """A pass of `drafted` tokens accepted `accepted` of them: all -> one more next time; none ->
        halve (to 0: plain decoding; a retry that failed doubles the wait before the next); some ->
        just past what was accepted."""
        if drafted <= 0:
            return
        if accepted == 0 and self.retrying:
            self.wait = min(MAX_RETRY_AFTER, self.wait * 2)
        elif accepted:
            self.wait = RETRY_AFTER
        self.retrying = False
        if accepted >= drafted:
            self.k = min(self.maximum, drafted + 1)
        elif accepted == 0:
            self.k = drafted // 2
        else:
            self.k = min(self.maximum, accepted + 1)


__all__ = ["MAX_RETRY_AFTER", "RETRY_AFTER", "DraftLength", "Lookup"]
