"""The differential test: the same requests to a real `mlx_lm.server` and, through a real
`pipeserve router`, to a 2- and a 3-stage cluster of the same model must get the same answers.

The model is a tiny random one whose chat template supports tools (testmodels/tools.py); its
two tool-call tokens, pushed with `logit_bias` and moved past with a `presence_penalty`, make
both servers produce tool calls, so tool parsing is compared on real output. Equal means: the
text, every tool call's name and arguments, the finish reason and the usage, streamed and not,
with the official `openai` client on both sides. `test_the_comparison_bites` shows that a
perturbed sampling parameter gives a different answer, so equality is not a coincidence of
an insensitive model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import free_port, wait_until
from orchestrator.registrar import ConfigFileRegistrar
from orchestrator.testmodels.tools import TOOL_CALL_TOKENS
from tests.support.reference_server import ReferenceServer, ask
from tests.support.router import RouterProc, write_yaml
from tests.support.tool_requests import ASK, EOS, HISTORY, ONE_CALL, TIME, TOOLS, TWO_CALLS, WEATHER

SPLITS = {"two": [(0, 1), (2, 3)], "three": [(0, 1), (2, 2), (3, 3)]}
# A random model seldom repeats a token by itself, so the penalty cases push one (id 300) with a
# logit bias: the penalties then decide how often it comes back.
CASES = {
    "chat-greedy": ("chat", {"messages": ASK, "max_tokens": 16, "temperature": 0}),
    "chat-multi-turn": ("chat", {"messages": [*ASK, {"role": "assistant", "content": "Sunny."},
                                              {"role": "user", "content": "And tomorrow?"}],
                                 "max_tokens": 12, "temperature": 0}),
    "completion-greedy": ("completion", {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0}),
    "seeded": ("chat", {"messages": ASK, "max_tokens": 16, "temperature": 0.9, "seed": 7}),
    "top-p-top-k-min-p": ("chat", {"messages": ASK, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9,
                                   "top_k": 20, "min_p": 0.05, "seed": 11}),
    "xtc": ("completion", {"prompt": "Pipeline stages", "max_tokens": 16, "temperature": 0.8, "seed": 5,
                           "xtc_probability": 0.5, "xtc_threshold": 0.05}),
    "repetition-penalty": ("completion", {"prompt": "stage stage stage stage", "max_tokens": 16, "temperature": 0,
                                          "repetition_penalty": 3.0, "repetition_context_size": 8,
                                          "logit_bias": {"300": 20}}),
    "presence-frequency": ("completion", {"prompt": "the the the", "max_tokens": 16, "temperature": 0,
                                          "presence_penalty": 5.0, "frequency_penalty": 4.0,
                                          "frequency_context_size": 12, "logit_bias": {"300": 25}}),
    "logit-bias": ("chat", {"messages": ASK, "max_tokens": 8, "temperature": 0, "logit_bias": {"300": 30}}),
    "tool-auto-one-call": ("chat", {"messages": ASK, "tools": TOOLS, "max_tokens": 8, "temperature": 0, **ONE_CALL}),
    "tool-parallel-calls": ("chat", {"messages": ASK, "tools": TOOLS, "max_tokens": 8, "temperature": 0,
                                     **TWO_CALLS}),
    "tool-auto-prose": ("chat", {"messages": ASK, "tools": TOOLS, "max_tokens": 10, "temperature": 0}),
    "tool-result-turn": ("chat", {"messages": HISTORY, "tools": TOOLS, "max_tokens": 10, "temperature": 0}),
}
CALLING = {"tool-auto-one-call": 1, "tool-parallel-calls": 2}  # the cases must really call tools


@pytest.fixture(scope="module")
def tool_model(model_factory) -> Path:
    return model_factory(tools=True)


@pytest.fixture(scope="module")
def reference(tool_model: Path, tmp_path_factory: pytest.TempPathFactory):
    server = ReferenceServer(tool_model, tmp_path_factory.mktemp("reference") / "mlx_lm_server.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def router(tool_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """`pipeserve router` in front of a 2-stage and a 3-stage cluster (models "two", "three")."""
    root = tmp_path_factory.mktemp("differential")
    clusters = [LocalPipeline(root / name, tool_model, splits, threads=1, model_name=name)
                for name, splits in SPLITS.items()]
    router = None
    try:
        for c in clusters:
            c.start()
        cfg = write_yaml(root / "router.yaml", {
            "server": {"bind_address": "0.0.0.0:8080"}, "backends": [],
            "health_checks": {"enabled": True, "interval": "0.5s", "timeout": "2s", "unhealthy_threshold": 3,
                              "healthy_threshold": 1, "endpoint": "/v1/models"}})
        registrar = ConfigFileRegistrar(cfg)
        for name, c in zip(SPLITS, clusters):
            registrar.register(name, c.base_url, [name])
        router = RouterProc(cfg, free_port(), root / "router.log", 0.2).start(30)
        wait_until(lambda: set(router.models()) >= set(SPLITS), 30, message="the router to route both clusters")
        yield router
    finally:
        if router is not None:
            router.stop(5)
        for c in clusters:
            c.stop()


def _pipeserve(router: RouterProc):
    import openai

    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", list(CASES))
def test_cluster_answers_like_mlx_lm_server(case: str, stream: bool, reference, router, tool_model):
    kind, body = CASES[case]
    expected = ask(reference.client(), str(tool_model), kind, body, stream)
    for name in SPLITS:
        got = ask(_pipeserve(router), name, kind, body, stream)
        assert got == expected, f"{name}-stage cluster differs from mlx_lm.server on {case}"
    if case in CALLING:
        assert len(expected.tool_calls) == CALLING[case] and expected.finish == "tool_calls", expected


def test_tool_call_tokens_are_what_the_cases_assume(tool_model):
    from mlx_lm.tokenizer_utils import load

    tok = load(tool_model)
    assert [tok.vocab[t] for t in TOOL_CALL_TOKENS] == [WEATHER, TIME]
    assert tok.eos_token_ids == {EOS} and tok.has_tool_calling


@pytest.mark.parametrize("case,change", [
    ("seeded", {"seed": 8}),
    ("repetition-penalty", {"repetition_penalty": 0.0}),
    ("repetition-penalty", {"repetition_context_size": 2}),
    ("presence-frequency", {"frequency_penalty": 0.0, "presence_penalty": 0.0}),
    ("logit-bias", {"logit_bias": {}}),
    ("xtc", {"xtc_probability": 0.0}),
    ("top-p-top-k-min-p", {"top_k": 3}),
    ("tool-parallel-calls", {"logit_bias": {str(WEATHER): 150, str(TIME): 200, str(EOS): 100}}),
])
def test_the_comparison_bites(case: str, change: dict, reference, router, tool_model):
    """A perturbed sampling parameter changes the answer: the equality above is not luck."""
    kind, body = CASES[case]
    expected = ask(reference.client(), str(tool_model), kind, body, False)
    perturbed = ask(_pipeserve(router), "two", kind, {**body, **change}, False)
    assert perturbed != expected


def _raw(url: str, path: str, body: dict) -> dict:
    r = requests.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stop_string_like_mlx_lm_server(kind: str, stream: bool, reference, router, tool_model):
    """A stop string made of whole tokens of the greedy answer ends both servers' answers there
    (mlx_lm.server stops on the stop string's token ids, pipeserve on its text: equal here)."""
    from mlx_lm.tokenizer_utils import load

    tok = load(tool_model)
    base = ({"messages": ASK} if kind == "chat" else {"prompt": "Health checks"}) | {"max_tokens": 16, "temperature": 0}
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    first = _raw(reference.url, path, {**base, "model": str(tool_model), "logprobs": True})
    ids = [e["id"] for e in first["choices"][0]["logprobs"]["content"]]
    stop = next(s for k in range(4, len(ids) - 1) if list(tok.encode(s := tok.decode(ids[k:k + 2]),
                                                                    add_special_tokens=False)) == ids[k:k + 2]
                and s.strip() and tok.decode(ids).find(s) == len(tok.decode(ids[:k])))
    body = {**base, "stop": [stop]}
    expected = ask(reference.client(), str(tool_model), kind, body, stream)
    assert expected.finish == "stop" and stop not in expected.text
    for name in SPLITS:
        assert ask(_pipeserve(router), name, kind, body, stream) == expected


def test_greedy_logprobs_like_mlx_lm_server(reference, router, tool_model):
    """Each token's log-prob, and its top alternatives, as mlx_lm.server computes them (mlx_lm.server
    lists the alternatives unordered and, with top_logprobs, shows one of them as the token: so
    the chosen tokens' log-probs are asked without alternatives, and alternatives compared sorted).
    Equal to float rounding: mlx_lm.server's batch generator computes an unseeded request with
    other shapes than `generate_step`, which pipeserve matches bit for bit (test_exactness.py)."""
    def content(url: str, model: str, **extra: object) -> list[dict]:
        body = {"messages": ASK, "max_tokens": 12, "temperature": 0, "logprobs": True, "model": model, **extra}
        return _raw(url, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"]

    want, want_top = content(reference.url, str(tool_model)), content(reference.url, str(tool_model), top_logprobs=3)
    for name in SPLITS:
        got = content(router.url, name, top_logprobs=3)
        assert [g["logprob"] for g in got] == pytest.approx([w["logprob"] for w in want], abs=1e-3)
        for g, w in zip(got, want_top):
            assert sorted(a["logprob"] for a in g["top_logprobs"]) == pytest.approx(
                sorted(b["logprob"] for b in w["top_logprobs"]), abs=1e-3)
