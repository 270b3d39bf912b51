"""Which layers of a model are alike, so a timing of a few stands for all (issue 41 item 3).

Timing every layer of a model to learn what one costs took minutes on a busy machine (a
29-layer body of SmolLM2 alone: 5 minutes at load 7 on 2 cores). Layers built alike cost
alike, so the node agent times a short run of them (engine/profiling/layers.py) and divides
by its length, as it divided by all of them before. A layer's *kind* is what its cost depends
on, read without loading the model:

- its weights: every tensor under `layers.<i>.` by its name past the index, shape and dtype
  (from the safetensors headers): a mixture-of-experts layer, a dense one, a linear-attention
  or Mamba block and an attention layer differ there, and so does a quantized one;
- the config's per-layer pattern (`layer_types`, `hybrid_override_pattern`, ...), Gemma's
  `sliding_window_pattern` and Baichuan-M1's `sliding_window_layers`: a sliding-window layer
  has the same weights as a global one and attends to fewer keys.

`timed_layers` picks the run: the shortest one from the first layer (a stage's body starts
there) whose kinds come in the same shares as in all the layers it stands for, so its
average is theirs. A model whose kinds balance late (DeepSeek's few dense layers before
the experts) is timed that far (DeepSeek-V3's 3 dense of a 60-layer body: 30 layers), or
whole. Pure but for `tensor_headers`, which reads the headers (a few kilobytes a file).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.families.decoder_config import LAYER_PATTERN_KEYS, decoder_view

MIN_LAYERS = 2  # timed at least: one layer's step is a few hundred microseconds on a small model
SHARE_SLACK = 0.05  # a kind's share of the timed run may differ this much from its share of all
HEADER_MAX = 100 << 20  # a safetensors header larger than this is not one
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")

Tensors = Mapping[str, tuple[str, tuple[int, ...]]]  # name -> (dtype, shape)


def tensor_headers(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of the model's safetensors files: name -> (dtype, shape), from the headers only."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > HEADER_MAX:
                raise ValueError(f"{path}: not a safetensors file (header of {size} bytes)")
            header = json.loads(f.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                out[name] = (str(meta["dtype"]), tuple(int(d) for d in meta["shape"]))
    return out


def _pattern(view: Mapping[str, Any], count: int) -> list[str]:
    """The config's own word for each layer ("" where it has none)."""
    for key in LAYER_PATTERN_KEYS:
        value = view.get(key)
        if isinstance(value, (list, str)) and len(value) == count:
            return [str(v) for v in value]
    every = view.get("sliding_window_pattern")
    if isinstance(every, int) and every > 1:  # Gemma 2/3: every n-th layer attends globally
        return ["global" if (i + 1) % every == 0 else "sliding" for i in range(count)]
    windowed = view.get("sliding_window_layers")
    if isinstance(windowed, list):  # Baichuan-M1: the windowed layers by index
        return ["sliding" if i in windowed else "global" for i in range(count)]
    return [""] * count


def layer_kinds(tensors: Tensors, config: Mapping[str, Any], count: int) -> list[str]:
    """A short name of each of the `count` layers' kind: layers of one name are built alike (pure)."""
    parts: list[list[str]] = [[] for _ in range(count)]
    for name, (dtype, shape) in tensors.items():
        found = LAYER.search(name)
        if found and int(found.group(1)) < count:
            parts[int(found.group(1))].append(f"{found.group(2)}:{dtype}:{'x'.join(map(str, shape))}")
    words = _pattern(decoder_view(dict(config)), count)
    return [hashlib.sha256("|".join([words[i], *sorted(parts[i])]).encode()).hexdigest()[:8]
            for i in range(count)]


DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


def layer_bytes(tensors: Tensors, count: int) -> list[int]:
    """The weight bytes of each of the `count` layers (pure; 1 byte an element for 8-bit and odd dtypes)."""
    out = [0] * count
    for name, (dtype, shape) in tensors.items():
        found = LAYER.search(name)
        if found and int(found.group(1)) < count:
            size = DTYPE_BYTES.get(dtype, 1)
            for d in shape:
                size *= d
            out[int(found.group(1))] += size
    return out


def _balanced(run: Sequence[str], shares: Mapping[str, float]) -> bool:
    """Whether every kind's share of `run` is within SHARE_SLACK of `shares`."""
    counts = Counter(run)
    # every kind present: 20 kinds of 1 layer each have shares under the slack, absent or not
    return set(counts) == set(shares) and all(abs(counts[k] / len(run) - s) <= SHARE_SLACK for k, s in shares.items())


def timed_layers(kinds: Sequence[str], most: int, refused: Container[int] = ()) -> int:
    """How many layers from the first to time for the per-layer figure of `kinds` (pure): the
    shortest run of at least MIN_LAYERS whose kinds come in the shares of all of them and that
    ends where a stage may (`refused`: boundaries the family refuses); all of them (at most
    `most`, at a boundary allowed) when none is shorter; 0 when no boundary is allowed."""
    shares = {k: c / len(kinds) for k, c in Counter(kinds).items()} if kinds else {}
    for m in range(min(MIN_LAYERS, len(kinds)), min(most, len(kinds)) + 1):
        if m and m not in refused and _balanced(kinds[:m], shares):
            return m
    return next((b for b in range(min(most, len(kinds)), 0, -1) if b not in refused), 0)
