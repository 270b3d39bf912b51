"""A pipeline stage: its layers (shard, stand-ins, batched decode), its transport, sampling and prompt cache."""
