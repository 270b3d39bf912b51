"""Constrained decoding on the last stage: an llguidance grammar masks each step's logits.

The coordinator compiles and validates the grammar (engine/coordinator/structured.py) and sends it in the
request's OPEN frame; the last stage, which samples, keeps one `llguidance.LLMatcher` per
request. Each decode step asks the matcher which tokens may come next (a bitmask over the
vocabulary, computed in Rust while the step's graph is built), sets every other logit to
-inf, and feeds the chosen token back. A finished grammar allows only end-of-sequence.

The tokenizer llguidance needs is built from the model directory's tokenizer.json (no
transformers on a stage), once per set of end-of-sequence ids. Its build holds Python's lock for
its whole length (seconds for a large vocabulary on a loaded machine), long enough for the stage's
readers to miss the coordinator's pings: the last stage builds it at start, before it listens, for
the end-of-sequence ids the coordinator's tokenizer has (`model_eos_ids`); another set, should a
coordinator send one, is built on first use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np


class Constraint:
    """One request's grammar state."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.matcher = matcher
        self.vocab = vocab

    def mask(self, logits: mx.array) -> mx.array:
        """[1, V] logits with every token the grammar forbids now at -inf."""
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: logits.shape[-1]].astype(bool)
        if allowed.shape[0] < logits.shape[-1]:  # a head wider than the tokenizer: the padding is never allowed
            allowed = np.concatenate([allowed, np.zeros(logits.shape[-1] - allowed.shape[0], dtype=bool)])
        return mx.where(mx.array(allowed)[None], logits, mx.array(-mx.inf, dtype=logits.dtype))

    def accept(self, token: int) -> None:
        """Advance the grammar by the sampled token (always one the mask allowed)."""
        if not self.matcher.consume_token(token):
            raise ValueError(f"grammar refused token {token}: {self.matcher.get_error()}")


def model_eos_ids(model_dir: Path) -> list[int]:
    """The end-of-sequence ids mlx-lm's tokenizer gives the coordinator for this model, read from its
    files alone: tokenizer_config.json's (else special_tokens_map.json's) `eos_token`, looked up in
    tokenizer.json. Empty when the files do not say."""
    import tokenizers

    eos = None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            eos = json.loads((model_dir / name).read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue
        if eos:
            break
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return []
    try:
        token = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(eos)
    except Exception:  # noqa: BLE001 - a tokenizer.json `tokenizers` cannot read: built on first use then
        return []
    return [] if token is None else [token]


class Constraints:
    """Builds `Constraint`s for the last stage; the llguidance tokenizer is made on first use."""

    def __init__(self, model_dir: Path, vocab: int) -> None:
        self.model_dir = Path(model_dir)
        self.vocab = vocab
        self._tokenizers: dict[tuple[int, ...], Any] = {}

    def tokenizer(self, eos_ids: list[int]) -> Any:
        """The llguidance tokenizer for these end-of-sequence ids (cached: ~1 s for a large vocabulary)."""
        key = tuple(sorted(set(eos_ids)))
        if key not in self._tokenizers:
            import llguidance

            try:
                text = (self.model_dir / "tokenizer.json").read_text()
            except OSError as exc:
                raise ValueError(f"constrained decoding needs the model's tokenizer.json: {exc}") from None
            self._tokenizers[key] = llguidance.LLTokenizer(text, n_vocab=self.vocab, eos_token=list(key) or None)
        return self._tokenizers[key]

    def build(self, grammar: str, eos_ids: list[int]) -> Constraint:
        """A fresh matcher for one request; ValueError when the grammar is invalid."""
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer(eos_ids), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"grammar: {matcher.get_error()}")
        return Constraint(matcher, self.vocab)
