"""The disk tier keeps prompt-cache scopes apart across a restart (issue 39, item 1), over real
stage processes: an entry written for one scope comes back warm for that scope only.

The coordinator (a `Pipeline` in the test process) sends each save with its scope; the stages
write it into the file, list it after the restart, and the coordinator adopts the file back
into that scope. Were the scope lost on disk, the adopted entry would land in the default scope
(or another) and a caller of that scope would read it back as cached tokens.
"""

from __future__ import annotations

import shutil
import signal

from orchestrator.engine.coordinator.pipeline import GenerationParams
from orchestrator.proc import wait_until
from tests.support.engine_harness import TOP, InTestCoordinator

PROMPT = [(i * 37 + 11) % 500 for i in range(60)]
TOKENS = 6


def _submit(coord: InTestCoordinator, prompt: list[int], scope: str):
    return coord.pipeline.submit(prompt, GenerationParams(max_tokens=TOKENS, top_logprobs=TOP), (), scope)


def test_an_entry_adopted_after_a_restart_stays_in_its_scope(model_factory, launch, tmp_path):
    model = shutil.copytree(model_factory(), tmp_path / "models" / "m")
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prompt_cache_disk_bytes=1 << 30)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        one = coord.collect(_submit(coord, PROMPT, "alice"))
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store alice's turn")
        cluster.kill("stage-1", signal.SIGKILL)
        assert cluster.procs["stage-1"].wait_exit(10)
        wait_until(lambda: not coord.pipeline.health.ready, 10, 0.02, "the coordinator to notice the lost stage")
        cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                                   "--model", str(model)])
        coord.wait_ready()
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 20, 0.05, "the index to adopt the file")

        second = PROMPT + one.tokens + [3, 1, 4]
        for scope in ("", "bob"):  # the default scope and another caller: nothing of alice's
            gen = _submit(coord, second, scope)
            coord.collect(gen)
            assert gen.cached_tokens == 0, scope
        gen = _submit(coord, second, "alice")
        coord.collect(gen)
        assert gen.cached_tokens == len(PROMPT) + TOKENS - 1  # alice's, warm across the restart
    finally:
        coord.stop()
