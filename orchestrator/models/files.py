"""Writing model directories that mlx-lm loads: weights, config, tokenizer config.

Shared by the random test model and the demo import. Everything here is deterministic
(sorted keys, fixed layout) so that the same inputs give byte-identical files, which lets
nodes compare models by checksum.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx

# ChatML, the format of SmolLM2 and of the random test model. The test model has no default
# system prompt: a template that adds text on its own would only make tests harder to read.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DTYPES: dict[str, mx.Dtype] = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def mx_dtype(name: str) -> mx.Dtype:
    """Map a dtype name ("float32", "bfloat16", "float16") to the mlx dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}") from None


def write_json(path: Path, data: Any) -> None:
    """Write JSON with sorted keys and a trailing newline (stable bytes for checksums)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def shard_name(index: int, count: int) -> str:
    """Hugging Face shard file name, `index` counted from 1."""
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def save_weights(out_dir: Path, shards: Sequence[Mapping[str, mx.array]]) -> list[Path]:
    """Save tensors as safetensors, one file per mapping in `shards`.

    One shard gives `model.safetensors`; several give `model-0000k-of-0000n.safetensors`
    plus `model.safetensors.index.json` (HF layout), so that a stage can open only the
    files holding its layers. mx.save_safetensors lays out data in insertion order, so
    keys are inserted sorted to make the bytes independent of the caller's dict order.
    """
    if not shards:
        raise ValueError("no weights to save")
    names = ["model.safetensors"] if len(shards) == 1 else [shard_name(i + 1, len(shards)) for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    total_size = 0
    paths = []
    for name, tensors in zip(names, shards):
        ordered = {key: tensors[key] for key in sorted(tensors)}
        for key, value in ordered.items():
            if key in weight_map:
                raise ValueError(f"tensor {key} appears in two shards")
            weight_map[key] = name
            total_size += value.nbytes
        path = out_dir / name
        mx.save_safetensors(str(path), ordered, metadata={"format": "mlx"})
        paths.append(path)
    if len(shards) > 1:
        write_json(
            out_dir / "model.safetensors.index.json",
            {"metadata": {"total_size": total_size}, "weight_map": weight_map},
        )
    return paths


def write_tokenizer_config(
    out_dir: Path,
    *,
    chat_template: str,
    bos_token: str | None,
    eos_token: str,
    pad_token: str | None,
    unk_token: str | None,
    model_max_length: int,
) -> None:
    """Write tokenizer_config.json next to an existing tokenizer.json.

    `tokenizer_class` is the generic fast tokenizer on purpose: with a model-specific class
    (LlamaTokenizer, GPT2Tokenizer) transformers 5 rebuilds the pre-tokenizer itself and may
    not match tokenizer.json. BOS is never added automatically: both ChatML templates start
    with `<|im_start|>`, which is SmolLM2's BOS, so an added BOS would be doubled.
    The chat template goes here rather than in chat_template.jinja so that transformers 4
    and 5 both read it.
    """
    write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "bos_token": bos_token,
            "eos_token": eos_token,
            "pad_token": pad_token,
            "unk_token": unk_token,
            "model_max_length": model_max_length,
            "chat_template": chat_template,
        },
    )


def check_target(out_dir: Path, *, overwrite: bool = False) -> None:
    """Raise FileExistsError if `out_dir` may not be (re)placed by a new model directory."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty (overwrite=True / --force replaces it)")


@contextmanager
def staged_directory(out_dir: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory beside `out_dir`; on success move it into place.

    Readers never see a half-written model: the directory appears by rename (atomic on one
    file system). On error the temporary directory is removed and `out_dir` is untouched.
    An existing non-empty `out_dir` is an error unless `overwrite`; then it is swapped out
    and deleted after the new one is in place.
    """
    out_dir = Path(out_dir).absolute()
    check_target(out_dir, overwrite=overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
        # mkdtemp makes 0700 directories; a model directory should read like any other.
        os.chmod(tmp, 0o755)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old.{os.getpid()}"
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
