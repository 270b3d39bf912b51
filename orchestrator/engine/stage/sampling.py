"""Token sampling on the last stage, with mlx-lm's own sampler and logits processors.

One step of a request is exactly `mlx_lm.generate.generate_step`'s: the logits processors
(`make_logits_processors`: logit bias, repetition / presence / frequency penalties) read the
request's token history, the log-softmax follows, then `make_sampler`'s chain (top-p, min-p,
XTC, top-k, temperature) picks the token. Greedy without processors is the very computation
of mlx-lm, bit for bit. A grammar (constrained decoding, engine/stage/constraint.py) masks the
logits after the processors.

Each request owns its PRNG key: mlx-lm's samplers draw from MLX's global key sequence, so the
stage seeds that sequence with the request's key before sampling and keeps the key the draw
leaves behind. A seeded request therefore draws exactly what `mlx_lm.server` draws after
`mx.random.seed(seed)`, through any split and beside any other request in a batch.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler

RESULT = struct.Struct("<if")  # token id, its log-prob
MAX_TOP_LOGPROBS = 20
MAX_CONTEXT_SIZE = 4096  # repetition/presence/frequency context: the history an OPEN frame carries
MAX_LOGIT_BIAS = 1024  # entries; the API bounds it tighter (openai_schema.MAX_LOGIT_BIAS)
MAX_TEMPERATURE = 10.0

Constraint = Any  # engine/constraint.Constraint: mask(logits) -> logits, accept(token)


def _number(params: dict, key: str, default: float, low: float, high: float) -> float:
    value = float(params.get(key, default))
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"sampling parameters out of range: {key}={value}")
    return value


def _integer(params: dict, key: str, default: int, low: int, high: int) -> int:
    raw = params.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw != int(raw):
        raise ValueError(f"{key} must be an integer")
    value = int(raw)
    if not low <= value <= high:
        raise ValueError(f"sampling parameters out of range: {key}={value}")
    return value


def _token_list(raw: Any, key: str, limit: int, vocab: int) -> list[int]:
    if not isinstance(raw, list) or len(raw) > limit:
        raise ValueError(f"{key} must be a list of at most {limit} token ids")
    out = [_integer({key: t}, key, 0, 0, vocab - 1) for t in raw]
    return out


class Sampler:
    """Sampling state of one request on the last stage."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_logprobs: int = 0,
                 seed: int | None = None, top_k: int = 0, min_p: float = 0.0, xtc: tuple[float, float] = (0.0, 0.1),
                 xtc_special: list[int] | None = None, logit_bias: dict[int, float] | None = None,
                 penalties: tuple[tuple[float, int], ...] = ((0.0, 20), (0.0, 20), (0.0, 20)),
                 history: list[int] | None = None, constraint: Constraint | None = None) -> None:
        self.temperature = temperature
        self.top_logprobs = top_logprobs
        self.constraint = constraint
        self._sample: Callable[[mx.array], mx.array] = make_sampler(
            temperature, top_p=top_p, min_p=min_p, top_k=top_k, xtc_probability=xtc[0], xtc_threshold=xtc[1],
            xtc_special_tokens=xtc_special or [])
        (rep, rep_n), (pres, pres_n), (freq, freq_n) = penalties
        self.processors = make_logits_processors(logit_bias or None, rep, rep_n, pres, pres_n, freq, freq_n)
        self.keep = max((n for p, n in penalties if p), default=0)
        self.history = list(history or [])[-self.keep:] if self.keep else []
        self.key: tuple[int, int] | None = None
        self._next_key: mx.array | None = None
        if temperature > 0:
            seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
            self.key = tuple(mx.random.key(seed & 0xFFFFFFFFFFFFFFFF).tolist())

    @classmethod
    def from_params(cls, params: dict, vocab: int = 1 << 31,
                    constrain: Callable[[str, list[int]], Constraint] | None = None) -> "Sampler":
        """Build from the OPEN frame's JSON; anything malformed raises ValueError. `constrain(grammar,
        eos_ids)` builds the grammar constraint when the request has one."""
        if not isinstance(params, dict):
            raise ValueError("sampling parameters must be a JSON object")
        try:
            temperature = _number(params, "temperature", 0.0, 0.0, MAX_TEMPERATURE)
            top_p = _number(params, "top_p", 1.0, 0.0, 1.0)
            top = _integer(params, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
            seed = params.get("seed")
            seed = None if seed is None else _integer(params, "seed", 0, -(1 << 63), (1 << 64) - 1)
            top_k = _integer(params, "top_k", 0, 0, vocab)
            min_p = _number(params, "min_p", 0.0, 0.0, 1.0)
            xtc = (_number(params, "xtc_probability", 0.0, 0.0, 1.0), _number(params, "xtc_threshold", 0.1, 0.0, 1.0))
            xtc_special = _token_list(params.get("xtc_special_tokens", []), "xtc_special_tokens", 64, vocab)
            penalties = tuple((_number(params, f"{name}_penalty", 0.0, -1e4, 1e4),
                               _integer(params, f"{name}_context_size", 20, 0, MAX_CONTEXT_SIZE))
                              for name in ("repetition", "presence", "frequency"))
            if penalties[0][0] < 0:
                raise ValueError("sampling parameters out of range: repetition_penalty < 0")
            history = _token_list(params.get("history", []), "history", MAX_CONTEXT_SIZE, vocab)
            bias_raw = params.get("logit_bias", [])
            if not isinstance(bias_raw, list) or len(bias_raw) > MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias must be a list of at most {MAX_LOGIT_BIAS} pairs")
            bias = {}
            for pair in bias_raw:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError("logit_bias entries must be [token, bias] pairs")
                bias[_integer({"t": pair[0]}, "t", 0, 0, vocab - 1)] = _number({"b": pair[1]}, "b", 0.0, -1e4, 1e4)
            grammar = params.get("grammar")
            if grammar is not None and (not isinstance(grammar, str) or constrain is None):
                raise ValueError("grammar must be a string, on a stage that can constrain")
            eos = _token_list(params.get("eos_ids", []), "eos_ids", 64, vocab)
        except (TypeError, ValueError, OverflowError) as exc:  # the stage's error says "bad sampling parameters"
            raise ValueError(str(exc)) from None
        constraint = constrain(grammar, eos) if grammar is not None and constrain is not None else None
        return cls(temperature, top_p, top, seed, top_k, min_p, xtc, xtc_special, bias, penalties, history,
                   constraint)

    def logprobs(self, logits: mx.array) -> mx.array:
        """[1, L, V] logits -> the last position's processed log-probs [1, V], as generate_step computes them."""
        last = logits[:, -1, :]
        if self.processors:
            tokens = mx.array(self.history, dtype=mx.int32)
            for processor in self.processors:
                last = processor(tokens, last)
        if self.constraint is not None:
            last = self.constraint.mask(last)
        return last - mx.logsumexp(last, keepdims=True)

    def sample(self, logprobs: mx.array) -> mx.array:
        """Pick a token id from [1, V] log-probs (lazy; evaluate with the step)."""
        if self.key is None:
            return self._sample(logprobs)
        mx.random.seed((self.key[0] << 32) | self.key[1])  # the request's own place in its key sequence
        token = self._sample(logprobs)
        self._next_key = mx.random.state[0]
        return token

    def pick(self, logprobs: mx.array) -> tuple[mx.array, mx.array]:
        """The sampled token id [1] and its log-prob [1, 1], both lazy: evaluated with the step in
        ONE evaluation (a second one, to read the log-prob afterwards, wakes MLX's stream thread again)."""
        token = self.sample(logprobs)
        return token, mx.take_along_axis(logprobs, token.reshape(1, 1), axis=-1)

    def accept(self, token: int) -> None:
        """The step was evaluated and `token` chosen: advance history, key and grammar."""
        if self._next_key is not None:
            self.key = tuple(self._next_key.tolist())
            self._next_key = None
        if self.keep:
            self.history.append(token)
            del self.history[:-self.keep]
        if self.constraint is not None:
            self.constraint.accept(token)

    def encode(self, token: int, logprob: float, logprobs: mx.array) -> bytes:
        """The RESULT payload: token and its log-prob, then the top-k (id, log-prob) pairs of
        `logprobs` [1, V] if asked."""
        out = RESULT.pack(token, logprob)
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
