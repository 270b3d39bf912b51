"""Token sampling on the last stage: greedy exactly as mlx-lm, or seeded temperature/top-p.

Each request owns its PRNG key, so concurrent requests never disturb each other's draws
and the same seed gives the same tokens through any split.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import mlx.core as mx

RESULT = struct.Struct("<if")  # token id, its log-prob
MAX_TOP_LOGPROBS = 20


@dataclass
class Sampler:
    """Sampling state of one request."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_logprobs: int = 0
    key: mx.array | None = None

    @classmethod
    def from_params(cls, params: dict) -> "Sampler":
        """Build from the OPEN frame's JSON; anything malformed raises ValueError."""
        if not isinstance(params, dict):
            raise ValueError("sampling parameters must be a JSON object")
        try:
            temperature = float(params.get("temperature", 0.0))
            top_p = float(params.get("top_p", 1.0))
            top = int(params.get("top_logprobs", 0))
            seed = params.get("seed")
            seed = None if seed is None else int(seed)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"bad sampling parameters: {exc}") from None
        if not (0.0 <= temperature <= 10.0 and 0.0 < top_p <= 1.0 and 0 <= top <= MAX_TOP_LOGPROBS):
            raise ValueError("sampling parameters out of range")
        key = None
        if temperature > 0:
            seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
            key = mx.random.key(seed & 0xFFFFFFFF)
        return cls(temperature, top_p, top, key)

    def sample(self, logprobs: mx.array) -> mx.array:
        """Pick a token id from [1, V] log-probs (lazy; evaluate with the step)."""
        if self.temperature == 0:
            return mx.argmax(logprobs, axis=-1)
        self.key, sub = mx.random.split(self.key)
        scaled = logprobs * (1.0 / self.temperature)
        if self.top_p < 1.0:
            scaled = _top_p(scaled, self.top_p)
        return mx.random.categorical(scaled, key=sub)

    def encode(self, token: int, logprobs: mx.array) -> bytes:
        """The RESULT payload: token and its log-prob, then the top-k (id, log-prob) pairs if asked."""
        out = RESULT.pack(token, logprobs[0, token].item())
        if self.top_logprobs:
            ids = mx.argsort(-logprobs[0])[: self.top_logprobs]
            values = logprobs[0, ids].tolist()
            out += b"".join(RESULT.pack(int(i), float(v)) for i, v in zip(ids.tolist(), values))
        return out


def decode_result(payload: bytes) -> tuple[int, float, list[tuple[int, float]]]:
    """Inverse of `Sampler.encode`: (token, log-prob, [(id, log-prob), ...])."""
    if len(payload) % RESULT.size or not payload:
        raise ValueError(f"RESULT payload of {len(payload)} bytes")
    pairs = [RESULT.unpack_from(payload, i) for i in range(0, len(payload), RESULT.size)]
    return pairs[0][0], pairs[0][1], pairs[1:]


def _top_p(scaled: mx.array, top_p: float) -> mx.array:
    """Keep the smallest set of tokens whose probability mass reaches top_p."""
    probs = mx.softmax(scaled, axis=-1)
    order = mx.argsort(-probs, axis=-1)
    sorted_probs = mx.take_along_axis(probs, order, axis=-1)
    cumulative = mx.cumsum(sorted_probs, axis=-1)
    keep_sorted = (cumulative - sorted_probs) < top_p
    keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
    return mx.where(keep, scaled, -mx.inf)
