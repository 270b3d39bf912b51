"""A stage process imports mlx-lm's model code without its tokenizer stack (engine/stage/model_import.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Runs in a fresh interpreter, as a stage process would: the lean import, then the stage's
# own imports, a load and one forward; prints what the test checks.
STAGE_LIKE = """
import json, sys
from orchestrator.engine.stage.model_import import import_model_code_only, NoTokenizer
lean = import_model_code_only() if sys.argv[3] == "lean" else False
import mlx.core as mx
from orchestrator.engine.stage.shard import StageModel
m = StageModel(sys.argv[1], 0, int(sys.argv[2]))
logits = m.forward(mx.array([[1, 2, 3]]), m.make_cache())
refused = None
if lean:
    try:
        import mlx_lm.tokenizer_utils as t
        t.load(sys.argv[1])
        refused = False
    except NoTokenizer:
        refused = True
print(json.dumps({"lean": lean, "transformers": "transformers" in sys.modules, "refused": refused,
                  "logits": logits[0, -1].tolist()}))
"""


def test_stage_loads_and_runs_its_layers_without_transformers(model_factory) -> None:
    model = model_factory(layers=4)
    got, full = (_run_stage_like(model, how) for how in ("lean", "full"))
    assert got["lean"] is True and full["lean"] is False
    assert got["transformers"] is False  # the second of start-up a restarted stage no longer pays
    assert full["transformers"] is True  # (the ordinary import does pull it in)
    assert got["refused"] is True  # a stage asking for a tokenizer is told plainly
    assert got["logits"] == full["logits"]  # bit for bit: the same model code, only imported leaner


def _run_stage_like(model: Path, how: str) -> dict:
    """Both runs in fresh interpreters: the same BLAS and threads, only the import differs."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", STAGE_LIKE, str(model), "4", how], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_lean_import_steps_aside_once_mlx_lm_is_imported() -> None:
    import mlx_lm.utils  # noqa: F401  (the ordinary import, as in this test process)

    from orchestrator.engine.stage.model_import import import_model_code_only

    before = sys.modules["mlx_lm"]
    assert import_model_code_only() is False
    assert sys.modules["mlx_lm"] is before
