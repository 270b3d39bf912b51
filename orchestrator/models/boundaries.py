"""What each stage boundary of a model costs per token: on the wire, and in the cache of the stage after it.

The family rules say what crosses a boundary beside the hidden state (families/support.py
`boundary_tensors`; DeepSeek-V4.1's residual streams and shared state, families/hyper_layout.py);
the wire's format says what a NAMED frame's directory costs (engine/wire.py
`named_directory_bytes`). This module adds the two up for the model's description
(describe.py: `ModelDescription.boundary_bytes` and `received_cache_bytes`), so the family
package stays below the engine. Pure: no MLX import.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.engine.wire import named_directory_bytes
from orchestrator.families import hyper_layout
from orchestrator.families.decoder_config import decoder_view
from orchestrator.families.kv_layers import get
from orchestrator.families.support import boundary_tensors, family_of, hidden_shape

# The position at which a boundary's bytes per token are reported, where they depend on it
# (DeepSeek-V4.1's top-k picks and candidate flags grow with the context): the planner's
# default context length.
WIRE_POSITION = 4096


def hyper_wire_bytes_per_token(view: dict[str, Any], boundary: int, position: int, hidden: int,
                               dtype_bytes: int) -> float:
    """What one decoded token at `position` of DeepSeek-V4.1 costs on the wire at `boundary`, beyond
    the frame header: its tensors (`hyper_layout.wire_parts`) and the NAMED frame's directory, whose
    entry for a compressed part is there only in the steps that close a group (an empty tensor is
    not sent)."""
    parts = hyper_layout.wire_parts(view, boundary, position, hidden, dtype_bytes)
    ratios = list(get(view, "compress_ratios", []))
    sources = hyper_layout.crossing(view, boundary)
    total = named_directory_bytes({})
    for key, (rank, size) in parts.items():
        share = 1 / int(ratios[sources[key]]) if key in ("compress_kv", "index_k") else 1
        total += size + share * (named_directory_bytes({key: (1,) * rank}) - named_directory_bytes({}))
    return total


def received_cache_bytes(cfg: dict[str, Any], num_layers: int, dt: int) -> tuple[int, ...]:
    """Cache bytes per token the stage starting at each boundary keeps of what it receives
    (ModelDescription.received_cache_bytes); () when no family's stage keeps any."""
    if family_of(cfg) != hyper_layout.FAMILY:
        return ()
    view = decoder_view(cfg)
    return tuple(hyper_layout.received_bytes_per_token(view, b, dt) for b in range(1, num_layers))


def boundary_bytes(cfg: dict[str, Any], num_layers: int, hidden: int, dt: int) -> tuple[int, ...]:
    """Wire bytes per token at each boundary (ModelDescription.boundary_bytes); () when every
    boundary carries the hidden state alone."""
    out = []
    if family_of(cfg) == hyper_layout.FAMILY:  # DeepSeek-V4.1: its residual streams and shared state, at WIRE_POSITION
        view = decoder_view(cfg)
        for b in range(1, num_layers):
            out.append(round(hyper_wire_bytes_per_token(view, b, WIRE_POSITION, hidden, dt)))
        return tuple(out)
    for b in range(1, num_layers):
        extras = boundary_tensors(cfg, b)
        if not extras:
            out.append(hidden * dt)
            continue
        shapes = {"h": (1, 1, *hidden_shape(cfg, hidden)), **{k: (1, 1, *v) for k, v in extras.items()}}
        out.append(sum(math.prod(v) for v in shapes.values()) * dt + named_directory_bytes(shapes))
    return tuple(out) if any(x != hidden * dt for x in out) else ()
