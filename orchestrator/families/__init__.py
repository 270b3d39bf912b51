"""Model-family facts, read from config.json alone: the bottom of the import graph.

Which mlx-lm families the engine serves exactly and how each splits (`support`, with the
served families' names in `names`), one reading of a checkpoint's decoder settings
(`decoder_config`), what a layer caches and its byte formulas (`kv_layers`), and what crosses
DeepSeek-V4.1's stage boundaries (`hyper_layout`). The engine, the model descriptions, the
planner and the agent all read a family's rules here; this package imports no other package of
orchestrator (tests/families/test_house.py), so it can never close an import loop between them.
Pure: no MLX import.
"""
