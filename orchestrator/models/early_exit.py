"""`pipeserve make-draft-model`: a draft model cut from the served one, its first layers and its head.

Speculative decoding needs a small model with the served model's tokenizer on the coordinator's node
(engine/coordinator/draft_model.py). When the family ships no small sibling, the served model's own
first N layers, followed by its final norm and head, are one: the same tokenizer by construction, and
drafts that agree with the full model where its early layers already decide the next token. Pure
file work (no MLX): the safetensors headers are read and the kept tensors' bytes copied, so a 100 GB
model yields its draft without loading it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

from orchestrator.families.decoder_config import decoder_facts, read_config_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
           "generation_config.json", "chat_template.jinja", "tokenizer.model")


class DraftBuildError(ValueError):
    """The draft cannot be cut from this model as asked."""


def _tensors(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (name -> entry) and where its data starts."""
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    return header, 8 + length


def make_early_exit_draft(source: Path, target: Path, layers: int) -> Path:
    """Write the first `layers` decoder layers of `source` with its embedding, final norm and head to
    `target` (config.json's layer count cut to match); returns `target`."""
    source, target = Path(source), Path(target)
    config = read_config_file(source)
    total = decoder_facts(config).num_layers
    if not 0 < layers < total:
        raise DraftBuildError(f"a draft keeps 1 to {total - 1} of the model's {total} layers, not {layers}")
    if target.exists():
        raise DraftBuildError(f"{target} exists: choose a new directory")
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise DraftBuildError(f"{source} holds no safetensors weights")
    kept: list[tuple[str, dict[str, Any], Path, int]] = []
    for path in files:
        header, start = _tensors(path)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            match = _LAYER.search(name)
            if match is None or int(match.group(1)) < layers:
                kept.append((name, entry, path, start))
    target.mkdir(parents=True)
    try:
        _write(target / "model.safetensors", kept)
        text = dict(config.get("text_config") or config)
        for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
            if key in text:
                text[key] = layers
        cut = {**config, "text_config": text} if "text_config" in config else text
        (target / "config.json").write_text(json.dumps(cut, indent=2))
        for name in _COPIED:
            if (source / name).exists():
                shutil.copy2(source / name, target / name)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # nothing half-written is left behind
        raise
    return target


def _write(path: Path, kept: list[tuple[str, dict[str, Any], Path, int]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, entry, _, _ in kept:
        begin, end = entry["data_offsets"]
        header[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                        "data_offsets": [offset, offset + end - begin]}
        offset += end - begin
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw)
        for _, entry, source, start in kept:
            begin, end = entry["data_offsets"]
            with source.open("rb") as fh:
                fh.seek(start + begin)
                out.write(fh.read(end - begin))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `pipeserve make-draft-model` options."""
    parser.add_argument("source", type=Path, help="the served model's MLX directory")
    parser.add_argument("target", type=Path, help="a new directory for the draft (beside it in the models directory)")
    parser.add_argument("--layers", type=int, required=True, help="how many of its first layers the draft keeps")


def run(args: argparse.Namespace) -> int:
    """Cut the draft; a clear message and exit status 2 when it cannot be cut."""
    try:
        out = make_early_exit_draft(args.source, args.target, args.layers)
    except (DraftBuildError, OSError, ValueError) as exc:
        print(f"pipeserve make-draft-model: {exc}")
        return 2
    print(out)
    return 0
