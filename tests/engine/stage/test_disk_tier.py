"""The prompt cache's disk tier over real stage processes: a restarted stage comes back warm.

Two real stages with `prompt_cache_disk_bytes` set write their entries under the node's
models directory (the folder holding the model); one is killed and started again, the
coordinator (a `Pipeline` in the test process) learns the files every stage holds once the
pipeline is ready, and the next turn starts from them: cached tokens, and the cold run's
tokens. A new coordinator finds them too.
"""

from __future__ import annotations

import shutil
import signal

from orchestrator.engine.stage.disk_cache import FOLDER
from orchestrator.proc import wait_until
from tests.support.engine_harness import InTestCoordinator, reference

PROMPT = [(i * 37 + 11) % 500 for i in range(60)]
TOKENS = 8


def test_a_restarted_stage_comes_back_warm(model_factory, launch, tmp_path):
    model = shutil.copytree(model_factory(), tmp_path / "models" / "m")  # this test's own models directory
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prompt_cache_disk_bytes=1 << 30)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        one = coord.run(PROMPT, TOKENS)
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 10, 0.02, "the stages to store turn one")
        files = sorted(p.parent.name for p in (tmp_path / "models" / FOLDER).rglob("*.safetensors"))
        assert files == ["0-2", "2-4"]  # one file per stage, keyed by its layer range

        cluster.kill("stage-1", signal.SIGKILL)
        assert cluster.procs["stage-1"].wait_exit(10)
        wait_until(lambda: not coord.pipeline.health.ready, 10, 0.02, "the coordinator to notice the lost stage")
        assert coord.pipeline.cache.stats()["entries"] == 0
        cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                                   "--model", str(model)])
        coord.wait_ready()
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 1, 20, 0.05,
                   "the index to learn the files both stages hold")

        second = PROMPT + one.tokens + [3, 1, 4, 1, 5]
        gen = coord.generate(second, TOKENS)
        two = coord.collect(gen)
        assert gen.cached_tokens == len(PROMPT) + TOKENS - 1  # warm across the restart
        assert two.tokens == reference(model, second, TOKENS).tokens
        # Turn two's entry makes turn one's redundant in memory; on disk both stay.
        wait_until(lambda: len(list((tmp_path / "models" / FOLDER).rglob("*.safetensors"))) == 4, 10, 0.02,
                   "the stages to write turn two")
    finally:
        coord.stop()

    # A new coordinator (a new session: the stages drop their entries from memory) finds both turns.
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        wait_until(lambda: coord.pipeline.cache.stats()["entries"] == 2, 20, 0.05, "the index to learn both files")
        third = second + two.tokens + [2, 7]
        gen = coord.generate(third, TOKENS)
        assert coord.collect(gen).tokens == reference(model, third, TOKENS).tokens
        assert gen.cached_tokens == len(second) + TOKENS - 1
    finally:
        coord.stop()
