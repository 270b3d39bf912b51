"""Memory arithmetic of a stage: the weights it holds, the bytes it reads per token, its KV cache.

A stage owning layers [start, end) of an N-layer model holds:
- those layers, plus tensors outside any layer group (every stage loads them);
- the embedding when it is the first stage (start == 0);
- the final norm and the head when it is the last (end == N), and with tied embeddings the
  embedding matrix again, since the head is that matrix (both ends of a tied model hold it).

Layer bytes are the tensors' bytes as stored, so stacked MoE experts, shared experts and
quantization scales and biases (per-module bit widths included) count as they load. The KV
cache is counted per layer by what the layer keeps (models/kv.py): full attention grows
with the context, a sliding-window layer stops at its window, a linear-attention / SSM
layer holds a constant state, an MLP-only layer nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from orchestrator.models.describe import ModelDescription
from orchestrator.planner.plan_settings import PlanSettings

# mlx-lm's KVCache grows in steps of 256 tokens, so a sequence's cache is allocated for its
# length rounded up to the next multiple.
KV_STEP = 256


PROMPT_CACHE_SHARE = 0.5  # of a stage's headroom (free memory after weights, working KV and overhead)
PROMPT_CACHE_MAX = 8 << 30  # more rarely pays: entries are evicted long before


def prompt_cache_budget(free_bytes: int, total_bytes: int) -> int:
    """The prompt-cache budget of a stage (docs/prompt-cache.md): a share of its headroom, capped."""
    return max(0, min(int((free_bytes - total_bytes) * PROMPT_CACHE_SHARE), PROMPT_CACHE_MAX))


def kv_tokens(context_length: int) -> int:
    """Tokens a KV cache holds room for at `context_length`: rounded up to mlx-lm's 256-token steps."""
    return -(-context_length // KV_STEP) * KV_STEP


def layer_kv_bytes(model: ModelDescription, settings: PlanSettings) -> list[int]:
    """Cache bytes of every layer when every allowed sequence reaches the context length.

    A description without per-layer caches (from an older agent) counts standard attention
    in every layer: 2 (keys, values) x kv_heads x head_dim x element size per token.
    """
    tokens = kv_tokens(settings.context_length)
    if model.layer_caches:
        per_sequence = [c.bytes_for(settings.context_length if c.exact else tokens) for c in model.layer_caches]
    else:
        per_sequence = [model.kv_bytes_per_token_layer * tokens] * model.num_layers
    return [b * settings.max_concurrent_sequences for b in per_sequence]


def kv_cache_bytes(model: ModelDescription, settings: PlanSettings, start: int = 0, end: int | None = None) -> int:
    """KV cache of layers [start, end) (default: all) at the settings' context and concurrency."""
    return sum(layer_kv_bytes(model, settings)[start:end])


class StageCosts:
    """Byte counts of any candidate stage in O(1), from prefix sums over the layers."""

    def __init__(self, model: ModelDescription, settings: PlanSettings) -> None:
        self.model = model
        self.settings = settings
        self.num_layers = model.num_layers
        self._prefix = [0, *accumulate(model.layer_bytes)]
        self._kv_prefix = [0, *accumulate(layer_kv_bytes(model, settings))]
        # What a stage keeps of what it receives at its first boundary (DeepSeek-V4.1's compressed K/V).
        # (grown by concatenation: no 256-token steps)
        tokens = settings.context_length * settings.max_concurrent_sequences
        self._received = [b * tokens for b in model.received_cache_bytes]
        # A generated token reads every weight of a layer, but only one row of the embedding;
        # the head (the embedding matrix itself when tied) is read in full.
        self._embed_row = model.embedding_bytes // max(1, model.vocab_size)
        self._head_read = model.norm_bytes + (model.embedding_bytes if model.tied_embeddings else model.head_bytes)

    def layer_bytes(self, start: int, end: int) -> int:
        """Bytes of layers [start, end)."""
        return self._prefix[end] - self._prefix[start]

    def holds_embedding(self, start: int, end: int) -> bool:
        """Whether a stage over [start, end) keeps the embedding matrix."""
        return start == 0 or (end == self.num_layers and self.model.tied_embeddings)

    def weight_bytes(self, start: int, end: int) -> int:
        """Resident weight bytes of a stage over [start, end)."""
        m = self.model
        total = self.layer_bytes(start, end) + m.other_bytes
        if self.holds_embedding(start, end):
            total += m.embedding_bytes
        if start == 0:
            total += m.first_stage_bytes
        if end == self.num_layers:
            total += m.norm_bytes + m.head_bytes
        return total

    def token_bytes(self, start: int, end: int) -> int:
        """Weight bytes a stage over [start, end) reads per generated token: its share of the work."""
        total = self.layer_bytes(start, end)
        if start == 0:
            total += self._embed_row
        if end == self.num_layers:
            total += self._head_read
        return total

    def kv_bytes(self, start: int, end: int) -> int:
        """KV cache of a stage over [start, end) at the settings' context and concurrency, with
        what it keeps of the compressed K/V it receives (ModelDescription.received_cache_bytes)."""
        received = self._received[start - 1] if 0 < start <= len(self._received) else 0
        return self._kv_prefix[end] - self._kv_prefix[start] + received

    def overhead_bytes(self, runs_coordinator: bool) -> int:
        """Process overhead on a stage's node: the stage, plus the coordinator (and its draft model)
        when it runs there."""
        s = self.settings
        return s.stage_overhead_bytes + (s.coordinator_overhead_bytes + s.draft_model_bytes if runs_coordinator else 0)

    def total_bytes(self, start: int, end: int, runs_coordinator: bool) -> int:
        """Everything a stage over [start, end) needs on its node."""
        return self.weight_bytes(start, end) + self.kv_bytes(start, end) + self.overhead_bytes(runs_coordinator)

    def cluster_bytes(self, num_stages: int) -> int:
        """What any split into `num_stages` (>= 2) stages needs in total: the same for every split,
        since only the tied embedding's second copy depends on the stage count, not the cut points."""
        m = self.model
        tied_copy = m.embedding_bytes if (m.tied_embeddings and num_stages > 1) else 0
        return (m.total_bytes + tied_copy + m.other_bytes * (num_stages - 1) + self.kv_bytes(0, self.num_layers)
                + num_stages * self.settings.stage_overhead_bytes + self.settings.coordinator_overhead_bytes
                + self.settings.draft_model_bytes)

    def single_node_bytes(self) -> int:
        """What the whole model needs on one node (one stage plus the coordinator)."""
        return self.total_bytes(0, self.num_layers, runs_coordinator=True)


def wire_bytes_per_token(model: ModelDescription, boundary: int) -> int:
    """Bytes one decoded token puts on the wire at the boundary before layer `boundary`, beyond
    the frame header: the hidden state, or for a family that passes more the NAMED frame's
    tensors and directory (ModelDescription.boundary_bytes)."""
    if not 0 < boundary < model.num_layers:
        raise ValueError(f"no boundary before layer {boundary} in a {model.num_layers}-layer model")
    if model.boundary_bytes:
        return model.boundary_bytes[boundary - 1]
    return model.hidden_size * model.dtype_bytes


def plan_wire_bytes(model: ModelDescription, split: Sequence[tuple[int, int]]) -> int:
    """The most bytes per token any boundary of `split` carries (what the timing model sends)."""
    return max((wire_bytes_per_token(model, first) for first, _ in split[1:]),
               default=model.hidden_size * model.dtype_bytes)
