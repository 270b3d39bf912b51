"""What crosses DeepSeek-V4.1's stage boundaries, from config.json alone (pure: no MLX).

The stage itself uses mlx-lm's own `_crossing` and `_layout` (engine/stage/hyper_streams.py); the
agent's report and the planner, which must not import MLX, use this copy of their rules
(tests/engine/test_hyper_streams.py checks it against mlx-lm's on several layouts). What the
NAMED frame around these tensors adds is the wire's, counted in models/boundaries.py:

* a layer with a compression ratio reads the compressed K/V of the last compressing source
  layer at or before it; an indexer layer reads the index keys of the last layer that is both a
  source and an indexer, and the candidate blocks of the candidate-source layer before it; any
  other compressed layer reuses the top-k picks of the last indexer layer at or before it;
* a boundary carries what the layers after it read from layers before it: the residual streams
  [hc, H] and their pre-mix [hc] (float32) of every token, the compressed entries and index keys
  the step made (one per `ratio` tokens), the top-k picks (int32) and one flag per candidate
  block (bool) of every token;
* the stage after the boundary appends the compressed entries and index keys to its first
  layer's cache: they cost it memory as its own compressed layers' do.
"""

from __future__ import annotations

from typing import Any

from orchestrator.families.kv_layers import get as _get  # config.json's value, or the default when missing or null

FAMILY = "deepseek_v41"  # the family whose boundaries these rules describe


def _reads(view: dict[str, Any], layer: int) -> dict[str, int]:
    """The shared state layer `layer` reads, as {key: layer that writes it}."""
    ratios = list(_get(view, "compress_ratios", []))
    if layer >= len(ratios) or not ratios[layer]:
        return {}
    kv, index = set(_get(view, "kv_source_layer_ids", [])), set(_get(view, "index_source_layer_ids", []))

    def last(match: Any) -> int | None:
        return max((j for j in range(layer + 1) if match(j)), default=None)

    reads = {"compress_kv": last(lambda j: j in kv and ratios[j])}
    if layer in index:
        reads["index_k"] = last(lambda j: j in kv and j in index)
        source = int(_get(view, "candidate_source_layer_id", -1))
        if 0 <= source < layer and int(_get(view, "candidate_topk_blocks", 2048)) > 0:
            reads["candidates"] = source
    else:
        reads["topk_idx"] = last(lambda j: j in index)
    return {key: source for key, source in reads.items() if source is not None}


def crossing(view: dict[str, Any], boundary: int) -> dict[str, int]:
    """What layers from `boundary` on read from layers before it, as {key: layer that writes it}."""
    out: dict[str, int] = {}
    for layer in range(boundary, int(_get(view, "num_hidden_layers", 40))):
        for key, source in _reads(view, layer).items():
            if source < boundary:
                out[key] = source
    return out


def _entries(view: dict[str, Any], source: int | None, position: int) -> int:
    return position // int(list(_get(view, "compress_ratios", []))[source]) if source is not None else 0


def _index_keys(view: dict[str, Any], indexer: int, position: int) -> int:
    """The index keys indexer layer `indexer` scores after `position` tokens."""
    return _entries(view, _reads(view, indexer).get("index_k"), position)


def wire_parts(view: dict[str, Any], boundary: int, position: int, hidden: int, dtype_bytes: int
               ) -> dict[str, tuple[int, float]]:
    """What one decoded token at `position` puts on the wire at `boundary`: name -> (rank of the
    tensor, bytes for that token). Compressed parts are counted per token: one entry per `ratio`
    tokens, so a fraction of an entry."""
    ratios = list(_get(view, "compress_ratios", []))
    hc = int(_get(view, "hc_mult", 4))
    widths = {"compress_kv": int(_get(view, "head_dim", 512)), "index_k": int(_get(view, "index_head_dim", 128))}
    out: dict[str, tuple[int, float]] = {"h": (4, hc * hidden * dtype_bytes), "pre_mix": (3, hc * 4)}
    end = position + 1
    for key, source in crossing(view, boundary).items():
        if key in widths:
            out[key] = (3, widths[key] * dtype_bytes / int(ratios[source]))
        elif key == "candidates":
            block = int(_get(view, "candidate_block_size", 8))
            out[key] = (3, -(-_index_keys(view, source, end) // block))
        else:
            out[key] = (3, 4 * min(int(_get(view, "index_topk", 512)), _index_keys(view, source, end)))
    return out


def received_bytes_per_token(view: dict[str, Any], boundary: int, dtype_bytes: int) -> int:
    """Cache bytes per token a stage starting at `boundary` keeps of the compressed entries and
    index keys it receives (appended to its first layer's cache)."""
    ratios = list(_get(view, "compress_ratios", []))
    head, index_dim = int(_get(view, "head_dim", 512)), int(_get(view, "index_head_dim", 128))
    total = 0
    for key, source in crossing(view, boundary).items():
        if key in ("compress_kv", "index_k"):
            total += (head if key == "compress_kv" else index_dim) * dtype_bytes // int(ratios[source])
    return total
