"""The disk tier's model key (issue 39, "Also"): two models differing only in the middle of a
weight file get different keys, so neither adopts the other's entries.

Before, the key read each weight file's size, safetensors header and first and last MiB: a
fine-tune that leaves the embeddings and the last tensors alone shared the other's folder, and
its stages served KV computed by other weights (a wrong answer).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import mlx.core as mx

from orchestrator.engine.model_digest import weights_digest
from orchestrator.engine.stage.disk_cache import DIGESTS, FOLDER, DiskTier, model_hash
from orchestrator.engine.stage.shard import StageModel
from orchestrator.logs import EventLogger
from orchestrator.testmodels.llama import make_test_model

LOG = EventLogger("test-model-digest")
PROMPT = [(i * 37 + 11) % 500 for i in range(24)]


def _flip_middle(model_dir: Path) -> None:
    """Change one byte in the middle of the weight file, in place (size kept)."""
    [weights] = model_dir.glob("*.safetensors")
    with weights.open("r+b") as fh:
        fh.seek(weights.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x55]))


def test_models_differing_only_mid_file_never_share_disk_entries(tmp_path):
    models = tmp_path / "models"
    a = make_test_model(models / "a", vocab=16384)  # a tied 4 MiB embedding: the file's middle is in it
    [weights] = a.glob("*.safetensors")
    assert weights.stat().st_size > 3 << 20  # the middle lies outside the first and last MiB
    b = Path(shutil.copytree(a, models / "b"))
    _flip_middle(b)
    assert model_hash(a) != model_hash(b)

    stage = StageModel(a, 0, 4)
    cache = stage.make_cache()
    stage.forward(mx.array(PROMPT)[None], cache)
    mx.eval([c.state for c in cache])
    tier_a = DiskTier(models, a, (0, 4), 1 << 30, stage.make_cache, LOG)
    assert tier_a.write(PROMPT, cache, "user") is not None
    assert [e.tokens for e in tier_a.scan()] == [tuple(PROMPT)]
    tier_b = DiskTier(models, b, (0, 4), 1 << 30, StageModel(b, 0, 4).make_cache, LOG)
    assert tier_b.root != tier_a.root and tier_b.scan() == []  # b adopts nothing of a's


def test_each_files_digest_is_kept_until_the_file_changes(tmp_path):
    """The sha256 of each file is reused across starts, and a file rewritten in place (same size,
    same name) is hashed again: a stale digest would let the two models share entries again."""
    models = tmp_path / "models"
    model = make_test_model(models / "m", vocab=16384)
    digests = models / FOLDER / DIGESTS
    first = weights_digest(model, digests)
    assert digests.exists() and weights_digest(model, digests) == first
    _flip_middle(model)
    changed = weights_digest(model, digests)
    assert changed != first and changed == weights_digest(model)  # the cache agrees with a fresh hash
