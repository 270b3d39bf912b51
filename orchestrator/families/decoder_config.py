"""One reading of a model's config.json for every process: the decoder's numbers, wherever they are.

Published checkpoints keep the text decoder's settings in several layouts:

* flat, at the top level of config.json (most families);
* nested under `text_config` with a `vision_config` (or `audio_config`) beside it: the
  multimodal checkpoints mlx-lm serves by their text decoder (Gemma 3, Llama 4, Mistral 3,
  Qwen3-VL, Qwen3.5, Kimi-VL...). mlx-lm builds the decoder from `text_config` alone, so
  its keys win over the top level's; the top level keeps `model_type` (the module mlx-lm
  loads) and `quantization` (which mlx-lm reads there);
* with the layer count under another name (`num_layers`: LongCat-Flash, EXAONE 3; `n_layer`:
  GPT-2; `n_layers`: DBRX; `num_transformer_layers`: OpenELM) or only as a per-layer
  pattern (Nemotron-H's `hybrid_override_pattern`).

The stage, the coordinator, the node agent's model report and the planner's description
all read these facts here, so a checkpoint one of them accepts is never refused by another
for a key it looked for in the wrong place. Pure: no MLX import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

# Names of the decoder's layer count, in the order the families use them.
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_transformer_layers")
# Per-layer patterns whose length is the layer count when no count is given.
LAYER_PATTERN_KEYS = ("hybrid_override_pattern", "layers_block_type", "layer_types")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "hidden_dim", "model_dim")
# Sub-configs of towers the text decoder never runs.
TOWER_KEYS = ("vision_config", "audio_config", "vision_tower_config", "speech_config")
# Defaults a multimodal family's mlx-lm module fills in when the checkpoint omits the key
# (gemma3.py's ModelArgs: the published Gemma 3 configs carry no vocab_size).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {"gemma3": {"vocab_size": 262208}}
# Keys a family's module takes from the top level over text_config (gemma3.py overwrites
# text_config's vocab_size with its own).
TOP_LEVEL_WINS: dict[str, tuple[str, ...]] = {"gemma3": ("vocab_size",)}


class ModelConfigError(ValueError):
    """config.json is missing, unreadable or lacks what the engine needs; the message says which."""


class DecoderFacts(BaseModel):
    """What every process needs of a model's text decoder, read from config.json only."""

    model_config = ConfigDict(frozen=True)

    model_type: str  # the top level's: the mlx-lm module that loads the checkpoint
    num_layers: int
    hidden_size: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    nested: bool  # the decoder's keys came from text_config
    towers: tuple[str, ...]  # sub-configs of towers beside the decoder (vision_config, ...)


def read_config_file(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a model directory as a dict; ModelConfigError naming the file otherwise."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelConfigError(f"{model_dir}: no config.json (not a model directory)") from None
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{path}: not a JSON object")
    return cfg


def decoder_view(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as the text decoder sees it: the top level overlaid with `text_config`.

    `model_type`, `quantization` and the keys of TOP_LEVEL_WINS stay the top level's; the
    towers' sub-configs are dropped, so nothing of a vision encoder is read as the decoder's.
    """
    top = {k: v for k, v in cfg.items() if k not in TOWER_KEYS and k != "text_config"}
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return top
    model_type = cfg.get("model_type")
    family = model_type.replace("-", "_") if isinstance(model_type, str) else ""
    view = {**FAMILY_DEFAULTS.get(family, {}), **top, **text}
    for key in ("model_type", "quantization", "quantization_config", *TOP_LEVEL_WINS.get(family, ())):
        if key in top:
            view[key] = top[key]
    return view


def first_int(view: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of `keys` set in `view` as (key, value); ModelConfigError when one is set but not
    a positive integer (a wrong count must be refused, not skipped for the next key)."""
    for key in keys:
        value = view.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"config.json: {key} must be a positive integer, got {value!r}")
        return key, value
    return None


def layer_count(view: dict[str, Any]) -> int | None:
    """The decoder's layer count in a `decoder_view`: a count key, else a per-layer pattern's
    length; None when the config gives neither."""
    found = first_int(view, LAYER_COUNT_KEYS)
    if found is not None:
        return found[1]
    for key in LAYER_PATTERN_KEYS:
        if isinstance(view.get(key), (list, str)) and view[key]:
            return len(view[key])
    return None


def decoder_facts(cfg: dict[str, Any]) -> DecoderFacts:
    """The decoder's facts from a parsed config.json; ModelConfigError names what is missing."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelConfigError("config.json has no model_type")
    view = decoder_view(cfg)
    layers = layer_count(view)
    if layers is None:
        where = "text_config" if isinstance(cfg.get("text_config"), dict) else "config.json"
        raise ModelConfigError(f"{where} gives no layer count ({' / '.join(LAYER_COUNT_KEYS)}) "
                               "nor a per-layer pattern")
    hidden = first_int(view, HIDDEN_KEYS)
    vocab = first_int(view, ("vocab_size",))
    context = first_int(view, ("max_position_embeddings", "n_positions", "max_sequence_length"))
    return DecoderFacts(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden[1] if hidden else None,
        vocab_size=vocab[1] if vocab else None,
        max_position_embeddings=context[1] if context else None,
        nested=isinstance(cfg.get("text_config"), dict),
        towers=tuple(k for k in TOWER_KEYS if k in cfg),
    )


def read_decoder_facts(model_dir: str | Path) -> DecoderFacts:
    """`decoder_facts` of a model directory's config.json."""
    try:
        return decoder_facts(read_config_file(model_dir))
    except ModelConfigError as exc:
        if str(exc).startswith(str(model_dir)):
            raise
        raise ModelConfigError(f"{model_dir}: {exc}") from None
