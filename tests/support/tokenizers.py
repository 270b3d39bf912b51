"""A copy of a test model whose tokenizer maps two tokens to each other's ids: another tokenizer
with the same vocabulary size (a draft model that must be refused)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def with_swapped_tokens(model_dir: Path, target: Path) -> Path:
    """Copy `model_dir` to `target` with two tokens' ids swapped in its tokenizer.json."""
    shutil.copytree(model_dir, target)
    data = json.loads((target / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (target / "tokenizer.json").write_text(json.dumps(data))
    return target
