"""Wire bytes per token per stage boundary: the planner's figure against the frames a stage sends.

`python -m e2e.bench_wire` builds each family's tiny test model, runs the first stage of a
split at every boundary the engine allows over a 40-token prompt and one decoded token, and
encodes the decode step's frame exactly as a stage does (engine/tensors.py, engine/wire.py).
It prints one row per boundary: the planner's bytes per token (planner/memory.py
`wire_bytes_per_token` plus the 36-byte header) and the measured frame. Then the planner's
figures for published Gemma 4 E2B and Hunyuan-Large shapes (bfloat16). docs/families.md keeps
the table.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

FAMILIES = ("llama", "gemma4_text", "gemma3n", "hunyuan", "rwkv7", "talkie", "kimi_k3", "deepseek_v41")
# DeepSeek-V4.1's frames depend on the position (a compressed entry every `ratio` tokens, top-k picks
# and candidate flags that grow with the context): its rows average STEPS decode steps from the prompt's
# end against the planner's per-token figure at each of those positions (models/boundaries.py).
STEPS = 8
PROMPT = [(i * 37 + 11) % 500 for i in range(40)]

# Published shapes (config keys as their config.json gives them), for the planner's column only.
PUBLISHED = {
    "Gemma 4 E2B": {"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35,
                    "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 20, "sliding_window_pattern": 5},
    "Hunyuan-Large": {"model_type": "hunyuan", "hidden_size": 6400, "num_hidden_layers": 64, "use_cla": True,
                      "cla_share_factor": 2, "num_attention_heads": 80, "num_key_value_heads": 8},
    # mlx-lm's kimi_k3.py defaults (93 layers of 7168); the block size is an assumption of ours
    "Kimi-K3 (blocks of 12)": {"model_type": "kimi_k3", "hidden_size": 7168, "num_hidden_layers": 93,
                               "attn_res_block_size": 12},
    # mlx-lm's deepseek_v41.py defaults (40 layers of 5120, 4 streams, head_dim 512, index keys of 128, top-k
    # 512); the compression layout is an assumption of ours: windows only in layers 0-1, then ratios 4 and 128
    # alternating, every compressed layer a source, the ratio-4 ones indexers (at position 4096)
    "DeepSeek-V4.1 (assumed layout)": {
        "model_type": "deepseek_v41", "hidden_size": 5120, "num_hidden_layers": 40,
        "compress_ratios": [0, 0] + [4, 128] * 19, "kv_source_layer_ids": list(range(2, 40)),
        "index_source_layer_ids": list(range(2, 40, 2))},
}


def measured_rows(root: Path) -> list[tuple[str, int, int, int]]:
    """(family, boundary, planned, measured) bytes per decoded token, header included."""
    import mlx.core as mx

    from orchestrator.engine import wire
    from orchestrator.engine.stage.carry import Carry
    from orchestrator.engine.stage.shard import StageModel
    from orchestrator.engine.tensors import to_frame
    from orchestrator.families import hyper_layout
    from orchestrator.families.decoder_config import decoder_view
    from orchestrator.models.boundaries import hyper_wire_bytes_per_token
    from orchestrator.models.describe import describe_model
    from orchestrator.planner.memory import wire_bytes_per_token
    from orchestrator.testmodels.families import build_family_model

    rows = []
    for family in FAMILIES:
        model_dir = build_family_model(root / family, family)
        description = describe_model(model_dir)
        for b in range(1, description.num_layers):
            if b in description.refused_boundaries:
                continue
            stage = StageModel(model_dir, 0, b)
            cache = stage.make_cache()
            mx.eval(stage.forward(mx.array(PROMPT)[None], cache))
            steps = STEPS if family == hyper_layout.FAMILY else 1
            sent = 0
            for i in range(steps):
                out = stage.forward(mx.array([7 + i])[None], cache)
                mx.eval(out)
                position = len(PROMPT) + i
                frame = to_frame(1, position, out.h, extras=out.extras) if isinstance(out, Carry) else to_frame(
                    1, position, out)
                sent += len(wire.encode(frame))
            if family == hyper_layout.FAMILY:
                view = decoder_view(json.loads((model_dir / "config.json").read_text()))
                planned = sum(hyper_wire_bytes_per_token(view, b, len(PROMPT) + i, description.hidden_size,
                                                      description.dtype_bytes) for i in range(steps)) / steps
            else:
                planned = wire_bytes_per_token(description, b)
            rows.append((family, b, round(planned + wire.HEADER_SIZE), round(sent / steps)))
    return rows


def published_rows() -> list[tuple[str, int, int]]:
    """(shape, boundary, planned bytes per token with the header) at a few boundaries."""
    from orchestrator.engine import wire
    from orchestrator.families import support
    from orchestrator.models.boundaries import boundary_bytes

    out = []
    for name, cfg in PUBLISHED.items():
        n = cfg["num_hidden_layers"]
        per = boundary_bytes(cfg, n, cfg["hidden_size"], 2)
        refused = support.shared_kv_cuts(cfg)
        for b in sorted({1, n // 4, n // 4 + 1, n // 2 - 1, n // 2 + 1} - set(refused)):
            out.append((name, b, per[b - 1] + wire.HEADER_SIZE))
    return out


def main() -> int:
    """Print both tables (markdown)."""
    with tempfile.TemporaryDirectory() as tmp:
        rows = measured_rows(Path(tmp))
    print("| family (test model, float32) | boundary before layer | planned bytes/token | measured frame bytes |")
    print("|---|---:|---:|---:|")
    for family, b, planned, measured in rows:
        print(f"| {family} | {b} | {planned:,} | {measured:,} |")
    print("\n| published shape (bfloat16) | boundary before layer | planned bytes/token |")
    print("|---|---:|---:|")
    for name, b, planned in published_rows():
        print(f"| {name} | {b} | {planned:,} |")
    return 0 if all(p == m for _, _, p, m in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
