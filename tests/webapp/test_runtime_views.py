"""The node picker's support badge holds every node to the cluster's runtime, and the memory it shows
is the accelerator's (recorded CUDA reports: no GPU runs this suite)."""

from __future__ import annotations

from orchestrator.agent.device_memory import HostMemory, cuda_memory, host_memory
from orchestrator.agent.device_schemas import Runtime
from orchestrator.control.rules.state import Node
from tests.agent.test_device_memory import CUDA_INFO
from tests.support.view_states import rich_state
from webapp.views.cluster import form_view
from webapp.views.context import ViewContext
from webapp.views.nodes import nodes_view
from webapp.views.plan import fit_bar

CTX = ViewContext(role="viewer")
HOST = HostMemory(total=128 << 30, available=120 << 30)
CUDA = Runtime(backend="cuda", package="mlx-cuda-13 0.32.4", mlx="0.32.4", mlx_lm="0.32.2")
CPU = Runtime(backend="cpu", package="mlx-cpu 0.32.4", mlx="0.32.4", mlx_lm="0.32.2")


def gpu_state(*runtimes: Runtime | None):
    """rich_state's reachable nodes as linux-cuda machines running `runtimes` (node-c stays unreachable)."""
    state = rich_state()
    nodes = []
    for n, rt in zip(state.nodes, runtimes):
        r = n.report.model_copy(update={"accelerator": n.report.accelerator.model_copy(update={"family": "linux-cuda"}),
                                        "versions": {"mlx": "0.32.4", "mlx_lm": "0.32.2"}, "runtime": rt,
                                        "memory": cuda_memory(CUDA_INFO, None, None, HOST, None, 0) if rt is CUDA
                                        else host_memory(HOST, None, 0)})
        nodes.append(Node(**{**n.model_dump(), "report": r}))
    return state.model_copy(update={"nodes": (*nodes, *state.nodes[len(nodes):])})


def test_a_node_running_another_mlx_backend_is_unsupported_with_the_reason():
    v = form_view(gpu_state(CUDA, CPU, CUDA), CTX)
    a, b, _ = v["nodes"]
    assert a["support"] == "Supported"
    assert b["support"] == "Unsupported: mlx backend cpu (mlx-cpu 0.32.4) differs from cuda (mlx-cuda-13 0.32.4)"


def test_a_node_whose_mlx_does_not_load_is_unsupported():
    broken = Runtime(backend=None, mlx="0.32.4", mlx_lm="0.32.2", error="libcudart.so.13: cannot open shared object")
    v = form_view(gpu_state(CUDA, broken), CTX)
    assert v["nodes"][1]["support"].startswith("Unsupported: mlx does not load on this node (libcudart.so.13")


def test_the_picker_and_the_nodes_page_say_gpu_memory_on_a_cuda_node():
    state = gpu_state(CUDA, CUDA)
    picker = form_view(state, CTX)["nodes"]
    assert [n["support"] for n in picker[:2]] == ["Supported", "Supported"]
    # the GPU's free memory, not the host's 120 GiB of RAM
    assert picker[0]["memory_words"] == "GPU memory" and picker[0]["free_memory"] == "78.70 GiB"
    rows = nodes_view(state, CTX)["nodes"]
    assert rows[0]["memory_words"] == "GPU memory" and rows[0]["accelerator"] == "linux-cuda · mlx cuda"
    assert form_view(gpu_state(CPU, CPU), CTX)["nodes"][0]["memory_words"] == "memory"


def test_the_plan_bar_names_the_memory_it_is_measured_against():
    assert fit_bar(1, 1, 1, 10, kind="cuda")["free_what"] == "GPU memory free"
    assert fit_bar(1, 1, 1, 10, kind="metal")["memory_words"] == "GPU working-set memory"
    assert fit_bar(1, 1, 1, 10)["free_what"] == "free"
