"""The benchmark's models: SmolLM2 (imported from the wheel), a random ~1B Llama, and the
family rows' random-weight models shaped like published ones.

`prepare` runs inside a worker subprocess (see `worker.py`), so that the benchmark process
itself never imports MLX or holds a model; every model is generated once into the model
cache (`orchestrator.models.demo.cache_root()`), keyed by its shape and the generator's code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

# The random ~1B Llama of `--models llama1b` (testmodel.make_test_model's keywords).
LLAMA1B = MappingProxyType(dict(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=5632, vocab=32000))

# Shaped like a narrow published Llama (Llama-3.2-1B proportions at half the width and a
# few layers): 16 query heads of 64 over 4 key/value heads, a 2.75x SwiGLU MLP, a 32k
# vocabulary with a tied head. ~100 M parameters, ~400 MB in float32.
_DENSE = MappingProxyType({
    "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 6, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "tie_word_embeddings": True,
})
# Qwen3-MoE-like: the dense model's attention, every MLP a MoE of 16 experts, top-2
# (Qwen3-30B-A3B routes 8 of 128; Mixtral 2 of 8), expert width 512. ~190 M parameters,
# ~60 M of them active per token.
_MOE = MappingProxyType({
    **_DENSE, "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 512, "mlp_only_layers": (),
    "decoder_sparse_step": 1, "norm_topk_prob": True,
})


@dataclass(frozen=True)
class FamilyRow:
    """One row of the family table: a family of `orchestrator.testmodels.families` reshaped."""

    key: str                      # the --families name and the served model name
    family: str                   # a key of orchestrator.testmodels.families.FAMILIES
    quant: str | None             # None (float32) or a families.QUANTS name
    overrides: Mapping[str, Any]  # build_family_model(config_overrides=...)
    label: str                    # the table's description

    def digest(self) -> str:
        """Cache key of the generated model: its arguments and the generator's code."""
        from orchestrator.models import files
        from orchestrator.testmodels import families
        from orchestrator.testmodels import llama as testmodel
        h = hashlib.sha256(json.dumps([self.family, self.quant, dict(self.overrides)], sort_keys=True).encode())
        for module in (families, files, testmodel):
            h.update(Path(module.__file__).read_bytes())
        return h.hexdigest()[:12]


FAMILY_ROWS: tuple[FamilyRow, ...] = (
    FamilyRow("llama", "llama", None, _DENSE, "llama dense, float32 (hidden 1024, 6 layers, vocab 32k)"),
    FamilyRow("qwen3_moe", "qwen3_moe", None, _MOE,
              "qwen3_moe, float32 (hidden 1024, 6 MoE layers, 16 experts top-2)"),
    FamilyRow("llama-q4", "llama", "q4", _DENSE, "llama dense, 4-bit (q4, group 64; same shape)"),
)


def family_row(key: str) -> FamilyRow:
    """The FAMILY_ROWS entry named `key`."""
    for row in FAMILY_ROWS:
        if row.key == key:
            return row
    raise SystemExit(f"unknown family row {key!r}; choose from {[r.key for r in FAMILY_ROWS]}")


def _code_digest(*modules: Any, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


def _fresh(root: Path, prefix: str, digest: str) -> Path:
    """The cache directory for `prefix` + `digest`; older versions of it are removed (GBs)."""
    path = root / f"{prefix}-{digest}"
    if not (path / "config.json").is_file():
        for stale in root.glob(f"{prefix}-*"):
            if stale != path and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
    return path


def prepare(which: str) -> Path:
    """The directory of benchmark model `which`, importing or generating it once (cached).

    `which` is smollm2, llama1b or a FAMILY_ROWS key. Progress notes go to stderr."""
    from orchestrator.models import demo, files
    from orchestrator.models.demo import cache_root

    root = cache_root()
    if which == "smollm2":
        if hasattr(demo, "cached_demo_model"):  # the cache the tests and `make demo` use
            return demo.cached_demo_model("float32")
        from orchestrator.models import gguf

        path = root / f"demo-model-float32-{_code_digest(demo, files, gguf, extra=demo.WHEEL_SHA256)}"
        if not (path / "config.json").is_file():
            print(f"bench: importing SmolLM2-135M-Instruct into {path}", file=sys.stderr)
            demo.import_demo_model(path, dtype="float32", overwrite=True)
        return path
    if which == "llama1b":
        from orchestrator.testmodels import llama as testmodel
        path = _fresh(root, "bench-llama1b-float32",
                      _code_digest(testmodel, files, extra=json.dumps(dict(LLAMA1B), sort_keys=True)))
        if not (path / "config.json").is_file():
            print(f"bench: generating the random ~1B model into {path} (3.2 GB, ~30 s)", file=sys.stderr)
            testmodel.make_test_model(path, overwrite=True, **LLAMA1B)
        return path
    row = family_row(which)
    path = _fresh(root, f"bench-family-{row.key}", row.digest())
    if not (path / "config.json").is_file():
        from orchestrator.testmodels.families import build_family_model

        print(f"bench: generating {row.label} into {path} (~10 s)", file=sys.stderr)
        build_family_model(path, row.family, quant=row.quant, config_overrides=dict(row.overrides), overwrite=True)
    return path
