"""With automatic restarts off, a lost stage tears the session down, and the answers it held end cleanly.

Real agents, stage processes, coordinator and router (tests/control/conftest.py). The coordinator
holds answers in flight when a stage dies (docs/recovery.md); with restarts off nothing will bring
the stage back, and the control plane's all-or-nothing teardown stops every process. Every stream
in flight — completions, chat, messages, responses, through the router — must then end with its
API's error event (never a sign of completion) — the coordinator's own, written before it exits, not
the router's for a connection cut — and no engine process may be left running.
"""

from __future__ import annotations

import json
import os
import signal
import threading

from tests.control.conftest import MODEL_ID, Env
from tests.support.resume import Stream, ended_with_an_error
from tests.support.sessions import healthy, pids, wait_router_lists

LONG = 1500  # tokens: every stream is still running when the stage is killed


def test_with_restarts_off_every_held_stream_ends_with_an_error_and_nothing_is_left(env: Env):
    env.orch.update_settings(env.orch.state.settings.model_copy(update={"auto_restart": False}))
    s = healthy(env, env.orch.launch(env.session(), MODEL_ID).id)
    wait_router_lists(env, True)
    bodies = {
        "/v1/completions": {"prompt": "Once upon a time", "max_tokens": LONG},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "A long story?"}], "max_tokens": LONG},
        "/v1/messages": {"messages": [{"role": "user", "content": "A long story?"}], "max_tokens": LONG},
        "/v1/responses": {"input": "A long story?", "max_output_tokens": LONG},
    }
    streams = {path: Stream() for path in bodies}
    readers = [threading.Thread(target=streams[p].read, daemon=True, args=(
        env.router.url + p, {"model": MODEL_ID, "stream": True, "temperature": 0, **b})) for p, b in bodies.items()]
    for t in readers:
        t.start()
    assert all(st.first.wait(60) for st in streams.values()), "a stream never started"
    os.kill(pids(env, s.id)["stage-1"], signal.SIGKILL)
    st = env.orch.wait(lambda st: not st.sessions, 60)
    assert "automatic restarts are off" in st.history[-1].reason, st.history[-1].reason
    for t in readers:
        t.join(60)
    for path, stream in streams.items():
        assert stream.ended.is_set() and ended_with_an_error(stream), (path, stream.names()[-3:])
        # the coordinator's own word, not the router's "the backend broke off" for a cut connection
        assert "coordinator shutting down" in json.dumps(stream.events[-1][1]), (path, stream.events[-1])
    assert env.engine_processes() == [] and env.backends() == []
