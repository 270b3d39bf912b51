"""Tiny deterministic random-weight models of many mlx-lm model families.

Each family in `FAMILIES` is built with mlx-lm's own `Model` class for its `model_type`,
so a test that compares a pipeline split against single-process mlx-lm exercises the
family's real code: its attention variants (sliding windows, soft-capping, MLA, partial
RoPE, no-RoPE layers), its MoE routing, its linear-attention / SSM layers and its cache
types. The models are shaped to make splits interesting (4-8 layers whose kinds alternate
with a period of 2-3, sliding windows of 8 tokens so a 40-token prompt overflows them,
dense-then-MoE stacks) and small (hidden 64, vocabulary 512, well under 5 MB), so that a
test builds one in a fraction of a second.

Weights: the module tree comes from mlx-lm under `mx.random.seed(seed)` (which fixes the
few vectors mlx-lm initialises at random, such as biases); every float matrix (ndim >= 2)
is then redrawn from `numpy.random.default_rng(seed)` as normal(0, scale / sqrt(fan_in))
(embeddings normal(0, 1), or smaller where a family scales them up), the recipe of
`testmodel.py`. mlx-lm's own init makes a random
model repeat one token; the larger scale makes greedy output vary token to token, so a
wrong pipeline cannot pass a comparison by accident. Vectors with a meaning (norm weights,
SSM A_log / D / dt_bias, router score biases, attention sinks) keep mlx-lm's init.

Quantization goes through `mlx_lm.utils.quantize_model`, exactly as `mlx_lm.convert` does
(cast first, then quantize), and the tokenizer is the one `testmodel.py` trains.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from orchestrator.models.files import mx_dtype, save_weights, staged_directory, write_json
from orchestrator.testmodels import llama as testmodel
from orchestrator.testmodels.llama import SPECIAL_TOKENS, train_tokenizer, write_tokenizer
from orchestrator.testmodels.specs import FamilySpec
from orchestrator.testmodels.specs_carried import CARRIED
from orchestrator.testmodels.specs_classic import CLASSIC
from orchestrator.testmodels.specs_dense import DENSE
from orchestrator.testmodels.specs_moe import MOE
from orchestrator.testmodels.specs_multimodal import MULTIMODAL
from orchestrator.testmodels.specs_recent import RECENT

VOCAB = 512
QUANTS = ("q4", "q6", "q8", "mixed", "mxfp4")
# Affine bits per quant name; group 64 is what mlx-community publishes (and mlx-lm's
# default). The specs' shapes keep every in-dimension a multiple of 64 so nothing is left
# in float by mlx-lm's "in-dim divisible by group" rule unless a family says so.
_AFFINE_BITS = MappingProxyType({"q4": 4, "q6": 6, "q8": 8})
_GROUP = 64

# Ids of the test tokenizer's special tokens (see testmodel.SPECIAL_TOKENS).
_TOKEN_IDS = MappingProxyType({
    "bos_token_id": SPECIAL_TOKENS.index("<|im_start|>"),
    "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>"),
    "pad_token_id": SPECIAL_TOKENS.index("<|endoftext|>"),
})


# The spec tables, by kind; one mapping, as callers have always read it.
FAMILIES: Mapping[str, FamilySpec] = MappingProxyType({**DENSE, **MOE, **RECENT, **MULTIMODAL, **CLASSIC, **CARRIED})


def _family_config(spec: FamilySpec, dtype: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config.json content before quantization; `overrides` replace keys of the
    family's (inner, text) config, vocab_size included. The token ids always stay."""
    inner = {"model_type": spec.model_type, "vocab_size": VOCAB, **copy.deepcopy(spec.config),
             **copy.deepcopy(dict(overrides or {})), **_TOKEN_IDS}
    if not spec.text_config:
        return {**inner, "torch_dtype": dtype}
    # Published multimodal checkpoints (Qwen3.5, Gemma 3, Llama 4...) nest the language
    # model's settings; mlx-lm reads text_config (and tie_word_embeddings from it).
    inner["model_type"] = spec.text_model_type or f"{spec.model_type}_text"
    outer: dict[str, Any] = {"model_type": spec.model_type, "text_config": inner}
    if "tie_word_embeddings" in inner:
        outer["tie_word_embeddings"] = inner["tie_word_embeddings"]
    if spec.tower:
        # A vision encoder's own layer count, unlike the decoder's: a reader that took the
        # tower's numbers for the decoder's would refuse the split.
        outer["vision_config"] = {"model_type": f"{spec.model_type}_vision", "hidden_size": 32,
                                  "num_hidden_layers": 27, "patch_size": 14}
    return {**outer, **copy.deepcopy(spec.outer or {}), "torch_dtype": dtype, **_TOKEN_IDS}


def _tower_weights(prefix: str, dtype: mx.Dtype) -> dict[str, mx.array]:
    """A vision tower's tensors as published checkpoints name them, filled with NaN: the
    family's sanitize() drops them; if a stage ever computed with one, its output would be NaN."""
    nan = float("nan")
    return {f"{prefix}.blocks.0.attn.qkv.weight": mx.full((96, 32), nan, dtype),
            f"{prefix}.blocks.0.norm1.weight": mx.full((32,), nan, dtype),
            f"{prefix}.patch_embed.proj.weight": mx.full((32, 3, 14, 14), nan, dtype)}


def _fan_in(name: str, shape: tuple[int, ...]) -> int:
    # mlx Conv1d weights are (out, kernel, in / groups): the fan-in is kernel x in.
    # Linear and stacked-expert weights are (..., out, in).
    if "conv" in name:
        return int(np.prod(shape[1:]))
    return shape[-1]


def _randomize(model: nn.Module, seed: int, scale: float, embed_std: float) -> None:
    """Redraw every float matrix of `model` from numpy (see the module docstring)."""
    rng = np.random.default_rng(seed)
    params = dict(tree_flatten(model.parameters()))
    # By module type, not name: DeepSeek-V3's MLA has embed_q / unembed_out matrices.
    embeddings = {f"{path}.weight" for path, module in model.named_modules() if isinstance(module, nn.Embedding)}
    new = []
    for name in sorted(params):
        value = params[name]
        if value.ndim < 2 or not mx.issubdtype(value.dtype, mx.floating):
            continue
        draw = rng.standard_normal(value.shape, dtype=np.float32)
        if name in embeddings:
            draw *= np.float32(embed_std)
        else:
            draw *= np.float32(scale / np.sqrt(_fan_in(name, value.shape)))
        new.append((name, mx.array(draw)))
    model.update(tree_unflatten(new))


def _cast(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast float parameters as mlx_lm.convert does, honouring the model's cast_predicate
    (some families keep e.g. router biases or SSM decay in float32)."""
    keep = getattr(model, "cast_predicate", lambda _: True)
    params = tree_flatten(model.parameters())
    model.update(
        tree_unflatten(
            [(k, v.astype(dtype)) for k, v in params if keep(k) and mx.issubdtype(v.dtype, mx.floating)]
        )
    )


def _mixed_predicate(model: nn.Module, layers: int):
    """Per-module quantization like mlx-community's mixed recipes: 4-bit group-64 by
    default (the global entry), with overrides recorded per module path: 6-bit for the
    embedding and head, 8-bit for v_proj / down_proj (InternLM2's w2) in the first and
    last layers, and group 32 for the last layer's output projection (o_proj / out_proj,
    Ling's attention.dense, InternLM2's attention.wo, DeepSeek-V4.1's o_b_proj). The model's own predicate (e.g.
    8-bit routers) is applied first, so such modules are treated as in the uniform
    quantizations (mlx_lm.convert's recipes would replace it instead)."""
    own = getattr(model, "quant_predicate", None)
    last = f".layers.{layers - 1}."

    def predicate(path: str, module: nn.Module) -> bool | dict[str, Any]:
        if own is not None:
            decided = own(path, module)
            if decided is False or isinstance(decided, dict):
                return decided
        in_dim = module.weight.shape[-1]
        if path.endswith(("embed_tokens", "lm_head", "embeddings", "output")):
            return {"group_size": _GROUP, "bits": 6, "mode": "affine"}
        edge = ".layers.0." in path or last in path
        if edge and any(k in path for k in ("v_proj", "down_proj", "kv_b_proj", "feed_forward.w2")):
            return {"group_size": _GROUP, "bits": 8, "mode": "affine"}
        output_projection = path.endswith(("o_proj", "out_proj", "attention.dense", "attention.wo", "o_b_proj"))
        if last in path and output_projection and in_dim % 32 == 0:
            return {"group_size": 32, "bits": 4, "mode": "affine"}
        return True

    return predicate


def _quantize(model: nn.Module, config: dict[str, Any], quant: str) -> dict[str, Any]:
    """Quantize `model` in place with mlx-lm; return the config with "quantization"."""
    from mlx_lm.utils import quantize_model

    layers = len(model.layers)
    # quantize_model prints a bits-per-weight line; keep stdout for the CLI's result.
    with contextlib.redirect_stdout(io.StringIO()):
        if quant in _AFFINE_BITS:
            _, config = quantize_model(model, config, _GROUP, _AFFINE_BITS[quant])
        elif quant == "mixed":
            _, config = quantize_model(model, config, _GROUP, 4, quant_predicate=_mixed_predicate(model, layers))
        elif quant == "mxfp4":
            _, config = quantize_model(model, config, 32, 4, mode="mxfp4")
        else:
            raise ValueError(f"unknown quant {quant!r}; choose one of {list(QUANTS)}")
    return config


def build_family_model(
    out_dir: Path,
    family: str,
    *,
    dtype: str = "float32",
    quant: str | None = None,
    seed: int = 0,
    overwrite: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write a tiny random model of `family` (a key of FAMILIES) to `out_dir`; return it.

    The directory (config.json, model.safetensors, tokenizer files) loads with
    `mlx_lm.load` / `mlx_lm.utils.load_model`. `dtype` is float32, float16 or bfloat16
    (the float32 draws rounded); `quant` is None, "q4", "q6", "q8" (affine, group 64),
    "mixed" (4-bit with per-module overrides in config.json's "quantization") or "mxfp4",
    limited to the family's `quants`. The same arguments give byte-identical files. The
    directory appears atomically; an existing non-empty one is replaced only with
    `overwrite`.

    `config_overrides` reshapes the model with the family's own code and keys, e.g.
    `{"hidden_size": 1024, "num_hidden_layers": 6, "vocab_size": 32000}` for a model shaped
    like a published one (the benchmark's family rows). The family's `layer_pattern` then
    describes its defaults only; a vocab_size other than 512 trains a tokenizer of that
    size (a few seconds for 32000). Every override lands in config.json's "pipeserve" note.
    """
    from mlx_lm.utils import _get_classes

    try:
        spec = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}") from None
    target = mx_dtype(dtype)
    if quant is not None and quant not in spec.quants:
        raise ValueError(f"family {family} supports quant in {list(spec.quants)}, not {quant!r}")

    config = _family_config(spec, dtype, config_overrides)
    vocab = int((config.get("text_config") or config)["vocab_size"])
    # The loader's own lookup, so remapped names (mistral, kimi_k2) get the class that
    # mlx_lm.load will use.
    model_class, args_class = _get_classes(config)
    # mlx-lm initialises a few vectors (biases, SSM decay) with mx.random; seeding makes
    # them, and so the files, a function of the arguments.
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    _randomize(model, seed, spec.scale, spec.embed_std)
    if spec.fills:
        model.update(tree_unflatten([(k, mx.full(v.shape, value, v.dtype)) for k, v in tree_flatten(model.parameters())
                                     for suffix, value in spec.fills if k.endswith(suffix)]))
    _cast(model, target)
    if quant is not None:
        config = _quantize(model, config, quant)
    weights = {
        k: v for k, v in tree_flatten(model.parameters()) if not any(k.startswith(p) for p in spec.omit)
    }
    if spec.tower:
        weights.update(_tower_weights(spec.tower, target))
    mx.eval(list(weights.values()))
    config["pipeserve"] = {"kind": "family-test-model", "family": family, "seed": seed, "quant": quant,
                           "scale": spec.scale}
    if config_overrides:
        config["pipeserve"]["config_overrides"] = dict(config_overrides)
    tokenizer = train_tokenizer(vocab)
    with staged_directory(Path(out_dir), overwrite=overwrite) as tmp:
        save_weights(tmp, [weights])
        write_json(tmp / "config.json", config)
        write_tokenizer(tmp, tokenizer, model_max_length=2048)
    return Path(out_dir)


# `pipeserve make-test-model` options that shape the Llama test model only, with the
# flag that changes each from its default. With --family they are refused.
_LLAMA_ONLY = MappingProxyType({
    "layers": "--layers",
    "hidden": "--hidden",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "intermediate": "--intermediate",
    "vocab": "--vocab",
    "tied": "--untied",
    "shards": "--shards",
    "scale": "--scale",
})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve make-test-model`: the Llama options plus --family / --quant."""
    testmodel.add_arguments(parser)
    parser.add_argument(
        "--family", choices=sorted(FAMILIES), default=None, metavar="NAME",
        help="build a tiny model of this mlx-lm family instead of the Llama test model: "
             f"{', '.join(sorted(FAMILIES))}. Its shape is fixed; the Llama shape options "
             f"({', '.join(_LLAMA_ONLY.values())}) are refused with it; --dtype (also float16 "
             "through the API), --seed and --force apply",
    )
    parser.add_argument("--quant", choices=QUANTS, default=None,
                        help="with --family: quantize (q4/q6/q8 affine group 64, mixed 4/6/8-bit "
                             "per module, mxfp4)")
    # The parser's own defaults, so run() can tell which Llama options were changed.
    parser.set_defaults(llama_defaults={dest: parser.get_default(dest) for dest in _LLAMA_ONLY})


def run(args: argparse.Namespace) -> int:
    """Make the model (a family's, or the Llama test model); print its path. Returns the
    exit status (2 for bad options)."""
    if args.family is None:
        if args.quant is not None:
            print("make-test-model: --quant needs --family", file=sys.stderr)
            return 2
        return testmodel.run(args)
    changed = [flag for dest, flag in _LLAMA_ONLY.items() if getattr(args, dest) != args.llama_defaults[dest]]
    if changed:
        print(f"make-test-model: {', '.join(changed)}: Llama test model options, not usable with "
              f"--family (a family's shape is fixed)", file=sys.stderr)
        return 2
    try:
        path = build_family_model(args.out_dir, args.family, dtype=args.dtype, quant=args.quant,
                                  seed=args.seed, overwrite=args.force)
    except (ValueError, FileExistsError) as e:
        print(f"make-test-model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0
