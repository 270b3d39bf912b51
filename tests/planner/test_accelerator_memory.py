"""Plans from recorded Apple Silicon and CUDA reports use the accelerator's memory; mixed runtimes are refused.

The reports are built from recorded device information (tests/agent/test_device_memory.py's
inputs: no Mac or NVIDIA GPU runs this suite) by the agent's own functions, then read by the
planner's own `node_facts_from_report`, as the control plane does.
"""

from __future__ import annotations

from orchestrator.agent.device_memory import HostMemory, cuda_memory, host_memory, metal_memory, parse_nvidia_smi
from orchestrator.agent.device_schemas import Memory, Runtime
from orchestrator.agent.schemas import Accelerator, Report
from orchestrator.planner import Plan, PlanSettings, Refusal, RefusalCode, plan_cluster
from orchestrator.planner.facts import node_facts_from_report
from tests.agent.test_device_memory import CUDA_INFO, METAL_INFO
from tests.support.builders import report
from tests.support.planner_inputs import llama

GiB = 1 << 30
# 32 layers of hidden 4096 in bfloat16: ~14 GiB of weights (a Llama-3-8B-like model)
MODEL = llama(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256, tied=False,
              dtype="bfloat16", name="llama-8b-like")
SETTINGS = PlanSettings(context_length=4096, max_concurrent_sequences=4)
HOST_64G = HostMemory(total=64 * GiB, available=60 * GiB)
# an 8 GiB card: two of them cannot hold the ~17.3 GiB of weights, KV cache and overheads; their hosts could
SMALL_GPU = parse_nvidia_smi("NVIDIA GeForce RTX 3070, 8192, 300, 7892\n")[0]
# a 16 GB Mac: the GPU may wire ~10.7 GiB of it, vm_stat shows 14 GiB available
MAC_16G = {**METAL_INFO, "device_name": "Apple M2", "memory_size": 16 * GiB,
           "max_recommended_working_set_size": int(10.67 * GiB)}

CPU_RT = Runtime(backend="cpu", package="mlx-cpu 0.32.4", mlx="0.32.4", mlx_lm="0.32.2")
CUDA_RT = Runtime(backend="cuda", package="mlx-cuda-13 0.32.4", mlx="0.32.4", mlx_lm="0.32.2")
METAL_RT = Runtime(backend="metal", package="mlx-metal 0.32.4", mlx="0.32.4", mlx_lm="0.32.2")


def probed(name: str, memory: Memory, runtime: Runtime | None, family: str = "linux-cuda") -> Report:
    """A node's report of what its probes found (no models: the planner is given the description)."""
    rt = runtime or CPU_RT
    return report(name, memory=memory, runtime=runtime, accelerator=Accelerator(family=family, detail=""),
                  versions={"pipeserve": "0.1.0", "mlx": rt.mlx, "mlx_lm": rt.mlx_lm}, platform={}, disk=10**12)


def plan(*reports: Report) -> Plan | Refusal:
    return plan_cluster(MODEL, [node_facts_from_report(r) for r in reports], SETTINGS)


def test_a_model_that_fits_the_hosts_ram_is_refused_on_cuda_nodes_whose_gpus_it_does_not_fit():
    on_ram = plan(*(probed(n, host_memory(HOST_64G, None, 0), CPU_RT) for n in ("a", "b")))
    assert isinstance(on_ram, Plan)  # what the OS figure would have promised
    gpus = [probed(n, cuda_memory(CUDA_INFO, None, SMALL_GPU, HOST_64G, None, 0), CUDA_RT) for n in ("a", "b")]
    refused = plan(*gpus)
    assert isinstance(refused, Refusal)
    assert [r.code for r in refused.reasons] == [RefusalCode.MODEL_TOO_LARGE]
    assert "of GPU memory free" in refused.reasons[0].message


def test_a_cuda_plan_shows_the_gpu_memory_in_its_bars():
    big = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559, 2048, 79511\n")[0]
    gpus = [probed(n, cuda_memory(CUDA_INFO, 70 * GiB, big, HOST_64G, None, 0), CUDA_RT) for n in ("a", "b")]
    result = plan(*gpus)
    assert isinstance(result, Plan)
    assert {s.memory_kind for s in result.stages} == {"cuda"}
    assert all(s.free_bytes == 70 * GiB - (2048 << 20) for s in result.stages)  # mlx's limit, less what is used


def test_a_mac_plan_is_bounded_by_the_metal_working_set_not_vm_stat():
    vm = HostMemory(total=16 * GiB, available=14 * GiB)
    macs = [probed(n, metal_memory(MAC_16G, vm, None, 0), METAL_RT, "apple-silicon") for n in ("a", "b")]
    facts = [node_facts_from_report(r) for r in macs]
    assert all(f.free_bytes == int(10.67 * GiB) and f.memory_kind == "metal" for f in facts)
    tight = PlanSettings(context_length=4096, max_concurrent_sequences=16)  # ~19.6 GiB: < 28 GiB of RAM, > 21.3
    assert isinstance(plan_cluster(MODEL, [node_facts_from_report(probed(n, host_memory(vm, None, 0), METAL_RT,
                                                                         "apple-silicon")) for n in "ab"], tight),
                      Plan)
    refused = plan_cluster(MODEL, facts, tight)
    assert isinstance(refused, Refusal) and "GPU working-set memory" in refused.reasons[0].message


def test_mixed_backends_on_one_accelerator_family_are_refused_before_planning():
    cuda = probed("a", cuda_memory(CUDA_INFO, None, None, HOST_64G, None, 0), CUDA_RT)
    cpu_on_gpu_box = probed("b", host_memory(HOST_64G, None, 0), CPU_RT)  # mlx[cpu] on an NVIDIA machine
    refused = plan(cuda, cpu_on_gpu_box)
    assert isinstance(refused, Refusal)
    assert [(r.code, r.node_id) for r in refused.reasons] == [(RefusalCode.MIXED_BACKENDS, "b")]
    assert "cpu (mlx-cpu 0.32.4)" in refused.reasons[0].message
    assert "cuda (mlx-cuda-13 0.32.4)" in refused.reasons[0].message


def test_mixed_cuda_wheels_and_mixed_mlx_versions_are_refused():
    mem = cuda_memory(CUDA_INFO, None, None, HOST_64G, None, 0)
    cuda12 = CUDA_RT.model_copy(update={"package": "mlx-cuda-12 0.32.4"})
    refused = plan(probed("a", mem, CUDA_RT), probed("b", mem, cuda12))
    assert [r.code for r in refused.reasons] == [RefusalCode.MIXED_BACKENDS]  # type: ignore[union-attr]
    older = CUDA_RT.model_copy(update={"mlx": "0.32.3", "package": "mlx-cuda-13 0.32.3"})
    refused = plan(probed("a", mem, CUDA_RT), probed("b", mem, CUDA_RT), probed("c", mem, older))
    assert isinstance(refused, Refusal)
    assert [(r.code, r.node_id) for r in refused.reasons] == [(RefusalCode.MIXED_BACKENDS, "c"),
                                                                (RefusalCode.MIXED_ENGINE_VERSIONS, "c")]
    assert "mlx 0.32.3" in refused.reasons[1].message


def test_mixed_families_name_the_family_and_the_backend():
    mac = probed("a", metal_memory(METAL_INFO, HOST_64G, None, 0), METAL_RT, "apple-silicon")
    gpu = probed("b", cuda_memory(CUDA_INFO, None, None, HOST_64G, None, 0), CUDA_RT)
    refused = plan(mac, gpu)
    assert [r.code for r in refused.reasons] == [RefusalCode.MIXED_ACCELERATORS,  # type: ignore[union-attr]
                                                 RefusalCode.MIXED_BACKENDS]


def test_an_agent_that_predates_the_runtime_report_is_compared_by_engine_version_only():
    mem = host_memory(HOST_64G, None, 0)
    assert isinstance(plan(probed("a", mem, CPU_RT, "linux-cpu"), probed("b", mem, None, "linux-cpu")), Plan)
