"""Test inputs for the planner: model geometries (no files) and a LAN's interfaces (node facts: builders.py)."""

from __future__ import annotations

from orchestrator.families.support import unsupported_reason
from orchestrator.models.describe import DTYPE_BYTES, ModelDescription
from orchestrator.planner.perf_inputs import LayerTiming, LinkCost
from orchestrator.planner.transport import InterfaceFact
from tests.support.builders import facts


def llama_layer_params(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Parameters of one Llama decoder layer (no biases): attention, SwiGLU MLP, two norms."""
    return (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
            + 3 * hidden * intermediate + 2 * hidden)


def llama(*, layers: int = 30, hidden: int = 576, intermediate: int = 1536, heads: int = 9, kv_heads: int = 3,
          vocab: int = 49152, tied: bool = True, dtype: str = "float32", model_type: str = "llama",
          name: str = "smollm2-like", layer_bytes: tuple[int, ...] | None = None) -> ModelDescription:
    """A Llama-family description; the defaults are SmolLM2-135M's geometry in float32."""
    head_dim = hidden // heads
    elem = DTYPE_BYTES[dtype]
    per_layer = llama_layer_params(hidden, intermediate, heads, kv_heads, head_dim) * elem
    return ModelDescription(
        name=name, model_type=model_type, architecture=None,
        unsupported_reason=unsupported_reason({"model_type": model_type}),
        num_layers=layers, hidden_size=hidden, vocab_size=vocab, tied_embeddings=tied,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, dtype=dtype, dtype_bytes=elem,
        layer_bytes=layer_bytes if layer_bytes is not None else (per_layer,) * layers,
        embedding_bytes=vocab * hidden * elem, norm_bytes=hidden * elem,
        head_bytes=0 if tied else vocab * hidden * elem, other_bytes=0, weight_files=("model.safetensors",),
    )


def uniform(layers: int, layer_bytes: int = 1000, *, embedding: int = 0, head: int = 0, norm: int = 0,
            tied: bool = False, vocab: int = 10, kv_heads: int = 1, head_dim: int = 1,
            dtype: str = "float32", name: str = "toy") -> ModelDescription:
    """A toy description with round numbers, for hand-checked arithmetic."""
    return ModelDescription(
        name=name, model_type="llama", architecture=None, num_layers=layers, hidden_size=8,
        vocab_size=vocab, tied_embeddings=tied, num_attention_heads=kv_heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype], layer_bytes=(layer_bytes,) * layers,
        embedding_bytes=embedding, norm_bytes=norm, head_bytes=0 if tied else head, other_bytes=0,
        weight_files=("model.safetensors",),
    )


# Network interfaces of a node on a LAN (the transport tests of the planner and the control plane).
ETH = InterfaceFact(name="eth0", kind="ethernet", speed_mbps=1000, addresses=("192.168.1.10",))
LO = InterfaceFact(name="lo", kind="loopback", addresses=("127.0.0.1",))


def lan_node(i: int, *extra: InterfaceFact, timing: LayerTiming | None = None, **links: LinkCost):
    """Node i at 192.168.1.(10+i) on eth0, plus `extra` interfaces."""
    eth = ETH.model_copy(update={"addresses": (f"192.168.1.{10 + i}",)})
    return facts(i, host=f"192.168.1.{10 + i}").model_copy(
        update={"interfaces": (LO, eth, *extra), "timing": timing, "links": links})


def bridge(i: int, *, up: bool = True, addresses: tuple[str, ...] | None = None) -> InterfaceFact:
    return InterfaceFact(name="bridge0", kind="thunderbolt", up=up,
                         addresses=addresses if addresses is not None else ("fe80::1", f"169.254.7.{i + 1}"))


def rdma_nic(i: int) -> InterfaceFact:
    return InterfaceFact(name="ib0", kind="infiniband", rdma=True, addresses=(f"10.9.0.{i + 1}",))
