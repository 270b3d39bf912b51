"""Benchmarks of the pipeline against mlx-lm, side by side.

`make bench` (`e2e/bench_nodes.py`, `nodes_cli.main`) is the emulated-node comparison: each node is
one CPU core, a 2-stage pipeline against ONE node (`mlx_lm.server` on one core) and against mlx-lm's
own pipeline, in interleaved rounds; it prints one table of the targets (docs/benchmark.md has the
method and the current tables). Its modules: `nodes` (the rounds and metrics), `node_systems` (the
three servers, pinned), `pinning` (affinity), `openai_client` (streamed text completions, any
server), `node_models` (SmolLM2 and the qwen2 models), `nodes_report` (the tables and verdicts).

`make bench-machine` (`e2e/bench_pipeline.py`, which calls `cli.main`) is the older whole-machine
comparison (a 2-stage split against one process given every core); it prints a Markdown report and
writes it into docs/benchmark-history.md. Layout:

* `cli` — options, the run's order, writing the report (and JSON);
* measuring: `plan` (targets, systems), `measure` (a group: one model and BLAS, its
  systems side by side; the metrics), `family_rows` (c1 / c4 through the demo's pipeline
  for several model families), `client` (streamed HTTP completions, decode rates),
  `procs` (the systems' processes: `LocalPipeline` and the mlx-lm worker; /proc, `ss`),
  `worker` (the subprocess side: single-process mlx-lm and model preparation), `models`
  (which models, generated once into the cache);
* rendering: `report` (the document, the family table), `report_group` (a group's
  tables), `stats` (ratios of rounds, formatting);
* on their own (`python -m e2e.bench.<name>`): `speculation` (with ÷ without speculation
  ÷ single, three workloads, loopback or an emulated LAN with `lan_pipeline`), `structured`
  (decode with a JSON schema ÷ without), `prefill_batch` (would batching concurrent
  prefills pay: time and bits) and `lookup_replay` (prompt lookup replayed on the model's
  real answers: which matches are worth a pass).

What is compared, in ONE run and interleaved round by round (this machine is shared and
noisy, so only ratios measured side by side mean anything):

* single-process mlx-lm: `mlx_lm.generate.generate_step` on the whole model, in a worker
  subprocess whose BLAS (OpenBLAS preloaded by `orchestrator.engine.blas.preload()`, or the
  wheel's reference BLAS with PIPESERVE_BLAS=reference) and thread count are set by its
  environment. It is the reference. It serves one request at a time, so its aggregate
  decode rate at N concurrent requests is its 1-request rate (requests queue).
* the pipeline: `LocalPipeline` (stage processes plus the coordinator process), driven
  through the coordinator's HTTP API (`POST /v1/completions`, token-id prompt,
  temperature 0, streaming with `logprobs: 0` so that every token arrives as its own event).

Per system: decode tokens/s at 1, 2 and 4 concurrent requests (1 / median inter-token
interval, summed over concurrent requests), time to first token for a 512-token prompt,
resident memory per process, and for the pipeline the bytes that cross each boundary per
decode token (from the kernel's per-socket counters, `ss -ti`), plus where the time of one
token goes (per-stage step_ms from GET /health, CPU time per process from /proc) and the
micro-batch step times at 4 requests. Targets are judged on each system's best round;
"other load" says how many cores other users' processes took during each system's
measurements. The family rows add c1, c4 and c4/c1 for random-weight models of several
families (dense, MoE, 4-bit) shaped like published ones.
"""
