"""A model the engine cannot serve exactly is shown as "Unsupported: <reason>" wherever the
dashboard lists or offers models: the node list (Local and Distributed tabs) and the
cluster form's model choice, where it cannot be chosen. The HTML is parsed, and elements
are found by id and data attributes."""

from __future__ import annotations

from pathlib import Path

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.core import Orchestrator
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.html import Element, parse
from tests.support.view_states import rich_state
from tests.webapp.conftest import Web, make_web

VLM_REASON = "llava is a multimodal model; pipeserve serves text-only decoders"
MODELS = [
    ModelInfo(id="smol", mlx_format=True, supported=True, num_layers=30, total_bytes=540_000_000),
    ModelInfo(id="vlm", mlx_format=False, supported=False, unsupported_reason=VLM_REASON,
              reason="model_type 'llava' is not supported by the installed mlx-lm"),
    ModelInfo(id="odd-quant", mlx_format=True, supported=False, num_layers=4,
              unsupported_reason="7-bit affine quantization is not supported"),
    ModelInfo(id="big.gguf", mlx_format=False, reason="GGUF weights: convert to an MLX directory first"),
]


def text(element: Element) -> str:
    return element.text


def _web(tmp_path: Path) -> Web:
    """The rich dashboard state, node-a holding the models above."""
    (tmp_path / "router.yaml").write_text("backends: []\n")
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml"))
    state = rich_state()
    node_a = state.nodes[0]
    report = node_a.report.model_copy(update={"models": MODELS})
    orch._state = state.model_copy(update={"nodes": (node_a.model_copy(update={"report": report}), *state.nodes[1:])})
    return make_web(tmp_path, orch)


def test_the_model_choice_marks_and_disables_unsupported_models(tmp_path: Path) -> None:
    page = parse(_web(tmp_path).client("admin").get("/models?tab=distributed").get_data(as_text=True))
    options = {o.attrs["value"]: o for o in page.by_id("model").find_all("option")}
    assert "disabled" not in options["smol"].attrs and "Unsupported" not in text(options["smol"])
    assert "disabled" in options["vlm"].attrs
    assert text(options["vlm"]) == f"vlm — Unsupported: {VLM_REASON}"
    assert text(options["odd-quant"]).endswith("Unsupported: 7-bit affine quantization is not supported")
    assert text(options["big.gguf"]).endswith("Unsupported: GGUF weights: convert to an MLX directory first")
    hint = page.by_id("unsupported-models")
    assert [e.attrs["data-model"] for e in hint.find_all("span")] == ["vlm", "odd-quant", "big.gguf"]
    assert text(hint.find_all("span", data_model="vlm")[0]) == f"vlm — Unsupported: {VLM_REASON}"


def test_the_node_list_marks_unsupported_models_on_both_tabs(tmp_path: Path) -> None:
    client = _web(tmp_path).client("viewer")
    for tab in ("local", "distributed"):
        nodes = parse(client.get(f"/models?tab={tab}").get_data(as_text=True)).by_id("nodes")
        (node_a,) = nodes.find_all("li", data_node="node-a")
        chips = {e.attrs["data-model"]: e for e in node_a.find_all("span") if "data-model" in e.attrs}
        assert text(chips["smol"]) == "smol" and "unsupported" not in chips["smol"].attrs["class"]
        assert text(chips["vlm"]) == f"vlm — Unsupported: {VLM_REASON}"
        assert "unsupported" in chips["vlm"].attrs["class"].split()
        assert text(chips["odd-quant"]) == "odd-quant — Unsupported: 7-bit affine quantization is not supported"
