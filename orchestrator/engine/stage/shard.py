"""A stage's slice of the model: load only its layers, and run them with the family's own code.

The stage builds the family's mlx-lm `Model`, lazily, and replaces what it does not own
with the stand-ins of `stand_ins.py` before anything is read from disk. Every forward is the
family's own `Model.__call__` over the whole (mostly skipped) layer list, with the
family's own `make_cache()`: embedding scale, sliding-window and chunked masks built at
global layer indices, per-layer cache types, final norm, head and soft-capping are all the
family's code, so greedy output through any split is bit-for-bit the single-process result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model

from orchestrator.engine.stage.batch import (
    BatchUnavailable,
    RowCaches,
    RowStates,
    batch_caches,
    batch_parts,
    install_row_attention,
    restore,
    snapshot,
    split_attention_by_row,
)
from orchestrator.engine.stage.carry import (
    PER_LAYER,
    Carry,
    EveryPosition,
    PerLayerFeed,
    concatenate,
    handed_codec,
    row,
)
from orchestrator.engine.stage.hyper_streams import STREAMS_MIX, hyper_streams
from orchestrator.engine.stage.interrupt import LayerChecks
from orchestrator.engine.stage.model_parts import ShardError, activation_dtype, hollow_ends, layer_list
from orchestrator.engine.stage.stand_ins import (
    Checkpoint,
    Entry,
    Exit,
    Given,
    GivenSource,
    PerLayer,
    Skip,
    keep_readable,
)
from orchestrator.families import support
from orchestrator.families.decoder_config import ModelConfigError, decoder_facts, decoder_view, read_config_file


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a model directory without loading weights."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tied: bool
    max_position_embeddings: int | None

    @classmethod
    def read(cls, model_dir: Path) -> "ModelInfo":
        """Read config.json (decoder_config's reading, shared with the coordinator and the
        planner); raises ShardError when it is missing or not a decoder LM."""
        try:
            cfg = read_config_file(model_dir)
            facts = decoder_facts(cfg)
            if facts.hidden_size is None or facts.vocab_size is None:
                raise ModelConfigError("config.json gives no hidden_size or vocab_size")
            return cls(
                model_type=facts.model_type,
                num_layers=facts.num_layers,
                hidden_size=facts.hidden_size,
                vocab_size=facts.vocab_size,
                tied=bool(decoder_view(cfg).get("tie_word_embeddings", True)),
                max_position_embeddings=facts.max_position_embeddings,
            )
        except ModelConfigError as exc:
            raise ShardError(f"{model_dir}: not a usable MLX model directory ({exc})") from None


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json as a dict; ShardError when unreadable."""
    try:
        return read_config_file(model_dir)
    except ModelConfigError as exc:
        raise ShardError(f"not a usable MLX model directory ({exc})") from None


class StageModel:
    """Layers [start, end) of a model, plus the embedding (first stage) and norm/head (last)."""

    def __init__(self, model_dir: Path, start: int, end: int) -> None:
        config = read_config(model_dir)
        reason = support.unsupported_reason(config)
        if reason:
            raise ShardError(f"cannot serve this model exactly: {reason}")
        self.info = ModelInfo.read(model_dir)
        self.model_dir = Path(model_dir)  # the last stage reads its tokenizer.json for grammars
        if not 0 <= start < end <= self.info.num_layers:
            raise ShardError(f"layers {start}-{end - 1} outside the model's 0-{self.info.num_layers - 1}")
        self.start, self.end = start, end
        self.first = start == 0
        self.last = end == self.info.num_layers
        model, _ = load_model(Path(model_dir), lazy=True)
        layers = layer_list(model)
        if len(layers) != self.info.num_layers:
            raise ShardError(f"the model has {len(layers)} layers, config.json says {self.info.num_layers}")
        self.dtype = activation_dtype(model, layers[start], getattr(model, "cast_predicate", None))
        n = len(layers)
        cuts = support.shared_kv_cuts(config)
        for boundary in (start, end):
            if boundary in cuts:
                raise ShardError(f"cannot split here: {cuts[boundary]}")
        # Prune before evaluating: lazily-loaded tensors we drop are never read from disk.
        family = support.family_of(config) or ""
        self.family = family
        returns = support.TUPLE_LAYERS.get(family, 1)
        hidden_at = support.HIDDEN_AT.get(family, 0)
        handed_at = support.HANDED_ON.get(family, (0, ()))[0]
        passes = support.PASSED_ON.get(family)
        leading = 1 if family in support.STREAMS_FIRST else 0
        borrowed = support.borrowed_cache_layers(config)
        for i in [*range(start), *range(end, n)]:
            layers[i] = Skip(layers[i], returns, hidden_at, passes, leading, advances=i not in borrowed)
        row_attention = support.row_attention(config)
        if row_attention:
            only = support.ROW_ATTENTION_LAYERS.get(family)
            for layer in layers[start:end]:
                if only is None or type(layer).__name__ == only:
                    split_attention_by_row(layer, row_attention)
        self._entry = None if self.first else Entry(layers[start], hidden_at)
        if self._entry is not None:
            layers[start] = self._entry
        given = support.GIVEN_INPUT.get(family)
        # DeepSeek-V4.1: residual streams, their pre-mix and shared state cross (hyper_streams.py).
        self._streams = hyper_streams(family, decoder_view(config), start, end, self.last)
        self.hidden_shape = support.hidden_shape(config, self.info.hidden_size)
        # [streams, B, L, H] in the model, [B, L, streams, H] on the wire (Gemma 3n's AltUp)
        self._streams_first = family in support.STREAMS_FIRST
        self._exit = None if self.last else Exit(layers[end - 1], keep_arg=given[0] if given else None,
                                                 keep_keywords=self._streams is not None)
        if self._exit is not None:
            layers[end - 1] = self._exit
        # A tensor every layer takes (Talkie's normalised embedding): received beyond the first stage.
        self._given_name = given[1] if given else None
        self._given = GivenSource()
        if given and not self.first:
            for i in range(start, end):
                layers[i] = Given(layers[i], given[0], self._given)
        # Per-layer inputs (Gemma 4): fed to the layers from upstream, taken from those downstream.
        width = support.per_layer_width(config)
        per_layer_parts = support.PER_LAYER_INPUTS.get(support.family_of(config) or "", ()) if width else ()
        self._feed = PerLayerFeed(start, end, n) if width else None
        self.extras_in: dict[str, tuple[int, ...]] = {}
        if self._feed is not None:
            for i in range(start if not self.first else end, n if not (self.first and self.last) else 0):
                layers[i] = PerLayer(layers[i], i, self._feed, support.PER_LAYER_ARG.get(family))
            if not self.first:
                self.extras_in = {PER_LAYER: (n - start, width)}
        # What a layer hands the next one beside the hidden state, when a boundary falls between.
        self._handed_at = handed_at
        self._handed_codec = handed_codec(family, decoder_view(config))
        self._handed_in = {} if self.first else support.handed_on(config, start)
        self._handed_out = {} if self.last else support.handed_on(config, end)
        self.extras_in.update(self._handed_in)
        if self._given_name and not self.first:
            self.extras_in[self._given_name] = (self.info.hidden_size,)
        # Outermost: each layer this stage runs can be evaluated on its own (interrupt.py).
        self.checks = LayerChecks()
        for i in range(start, end):
            layers[i] = Checkpoint(layers[i], self.checks)
        hollow_ends(model, first=self.first, last=self.last, hidden=self.info.hidden_size, dtype=self.dtype,
                     per_layer=(per_layer_parts, n * width), kept=support.KEPT_EVERYWHERE.get(family, ()))
        self._model = model
        mx.eval(model.parameters())
        install_row_attention()
        # Decode steps of several requests run as one forward until a step shows the family
        # cannot be batched exactly (batch.py); then one request at a time, still exact.
        self.batchable = True
        self.batch_refusal: str | None = None
        # Prefill chunks the coordinator flags BATCH (PIPESERVE_PREFILL_BATCH=batched), the same way:
        # refused on its own (a recurrent state not yet made), leaving decode batching as it is.
        self.chunks_batchable = True
        self.chunks_refusal: str | None = None
        self._read_after_layers = support.READ_AFTER_LAYERS.get(family)

    @property
    def layer_range(self) -> tuple[int, int]:
        """Half-open (start, end) of the layers this stage runs."""
        return self.start, self.end

    @property
    def weight_bytes(self) -> int:
        """Bytes of the parameters this stage holds."""
        return sum(v.nbytes for _, v in nn.utils.tree_flatten(self._model.parameters()))

    @property
    def speculation_refusal(self) -> str | None:
        """Why this stage cannot verify drafted tokens exactly, or None (docs/speculation.md)."""
        return support.speculation_refusal(self.family)

    @property
    def by_position(self) -> tuple[Any, Any]:
        """How this stage's input and its output are cut and joined by position (a rollback's replay,
        rewind.py): along axis 1, or for DeepSeek-V4.1's boundaries by compressed group too."""
        if self._streams is None:
            return EveryPosition(), EveryPosition()
        return self._streams.inputs, self._streams.outputs

    def expects(self, position: int) -> Any:
        """What a frame for a step from `position` carries beside the hidden state (tensors.py's
        `extras` of from_frame_with): `extras_in`, or for DeepSeek-V4.1 a function of the step's
        length (its shared parts grow with the position)."""
        if self._streams is None or self.first:
            return self.extras_in
        return lambda length: {**self.extras_in, **self._streams.expected(position, length, self.dtype)}

    def make_cache(self) -> list[Any]:
        """A fresh cache for one request: the family's own `make_cache()`, whole model long.

        Entries of skipped layers only count positions (zero-width keys); they keep the masks
        a family builds from a particular layer's cache right at any split point.
        """
        if not hasattr(self._model, "make_cache"):
            return [KVCache() for _ in range(self.info.num_layers)]
        caches = self._model.make_cache()
        read = self._read_after_layers
        if read is not None and not self.start <= range(len(caches))[read] < self.end:
            keep_readable(caches[read])  # AFM's last cache, read after the loop by its (skipped) KV-reuse layers
        return caches

    def forward(self, x: mx.array | Carry, cache: list[Any]) -> mx.array | Carry:
        """Run the family's forward for one request.

        `x` is [1, L] token ids on the first stage, [1, L, H] hidden states elsewhere (a `Carry`
        with the extra tensors `extras_in` names, for a family that passes more). Returns the
        hidden state after this stage's last layer (a `Carry` with the per-layer inputs of the
        layers downstream, for such a family), or on the last stage the logits [1, L, V]
        (lazy: a prefill chunk evaluates only the caches, never the head).
        """
        if self._feed is not None:
            self._feed.begin(x.extras[PER_LAYER] if isinstance(x, Carry) else None)
        handed = None
        if isinstance(x, Carry) and self._given_name:
            self._given.value = x.extras[self._given_name]
        before = None
        if isinstance(x, Carry) and self._streams is not None:
            extras, start_pos, length = x.extras, cache[0].offset, x.h.shape[1]
            handed = (1, extras[STREAMS_MIX])
            before = lambda kwargs: self._streams.receive(extras, start_pos, length, kwargs)  # noqa: E731
        if isinstance(x, Carry):
            if self._handed_in:
                parts = tuple(x.extras[k] for k in self._handed_in)
                value = parts if len(parts) > 1 else parts[0]
                handed = (self._handed_at, value if self._handed_codec is None else self._handed_codec.from_wire(value))
            x = x.h
        if self._entry is not None:
            self._entry.feed(mx.moveaxis(x, 2, 0) if self._streams_first else x, handed, before)
            x = mx.zeros(x.shape[:2], mx.int32)  # token ids the embedding stand-in turns into zeros
        out = self._model(x, cache=cache)
        if self._exit is None:
            return out
        h, *rest = self._exit.take_all()
        if self._streams_first:
            h = mx.moveaxis(h, 0, 2)
        extras = {} if self._feed is None else {PER_LAYER: self._feed.outgoing()}
        if self._handed_out:
            value = rest[0] if self._handed_codec is None else self._handed_codec.to_wire(rest[0])
            extras.update(zip(self._handed_out, value if isinstance(value, tuple) else (value,)))
        if self._given_name:
            extras[self._given_name] = self._exit.kept()
        if self._streams is not None:
            kwargs = self._exit.keywords()
            extras[STREAMS_MIX] = rest[0]
            extras.update(self._streams.send(kwargs["shared"], kwargs["start_pos"], h.shape[0], h.shape[1], h.dtype))
        return Carry(h, extras) if extras else h

    def forward_batch(self, xs: list[Any], caches: list[list[Any]]) -> list[Any]:
        """One decode step (L=1) for several requests that have each seen at least one token.

        Returns what `forward` returns for each request, bit for bit: one batched forward when
        the family allows it (batch.py), otherwise (or after a refused step, with every cache
        restored) one forward per request.
        """
        if self.batchable:
            out, refusal = self._rows_or_refusal(xs, caches)
            if refusal is None:
                return out
            self.batchable, self.batch_refusal = False, refusal
        return [self.forward(x, c) for x, c in zip(xs, caches)]

    def forward_chunks(self, xs: list[Any], caches: list[list[Any]]) -> list[Any]:
        """Prefill chunks of one length for several requests, as one forward where the family allows.

        Each request keeps its own cache (attention row by row, as for decode rows), but the
        projections and MLP run over [B, L] rows at once, which a BLAS rounds differently from
        [1, L]: the result is the one-at-a-time result within float rounding, not bit for bit
        (docs/benchmark.md#batched-prefill). A refused step restores every cache and runs the
        chunks one by one; later ones too (`chunks_refusal` says why).
        """
        if self.chunks_batchable:
            out, refusal = self._rows_or_refusal(xs, caches)
            if refusal is None:
                return out
            self.chunks_batchable, self.chunks_refusal = False, refusal
        return [self.forward(x, c) for x, c in zip(xs, caches)]

    def _rows_or_refusal(self, xs: list[Any], caches: list[list[Any]]) -> tuple[list[Any], str | None]:
        """The rows' batched forward, or (nothing evaluated, every cache restored) why it was refused."""
        saved = snapshot(caches)
        try:
            return self._forward_rows(xs, caches), None
        except Exception as exc:  # noqa: BLE001 (the caller runs the rows one by one)
            restore(caches, saved)
            return [], f"{type(exc).__name__}: {exc}"

    def _forward_rows(self, xs: list[Any], caches: list[list[Any]]) -> list[Any]:
        rows = batch_caches(caches)
        out = self.forward(concatenate(xs), rows)
        parts = batch_parts(rows)
        if not all(r.consumed() for r in parts if isinstance(r, RowCaches)):
            raise BatchUnavailable("the family's attention does not go through mlx-lm's shared attention")
        for r in parts:
            if isinstance(r, RowStates):
                r.write_back()
        return [row(out, b) for b in range(len(xs))]

    def logprobs(self, logits: mx.array) -> mx.array:
        """Last stage: the last position's log-softmax, as `generate_step` computes it: [1, V]."""
        last = logits[:, -1, :]
        return last - mx.logsumexp(last, keepdims=True)
