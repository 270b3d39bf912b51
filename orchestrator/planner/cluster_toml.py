"""A Plan as the engine's cluster TOML (docs/configuration.md, "The cluster TOML"), validated by the engine's own model.

Node ids follow the engine's convention: "coordinator" (role hybrid) and "stage-K" (role
pipeline_stage), so `pipeserve stage --node-id stage-K` finds its entry. The plan's bounds
become engine limits: `context_length` and `max_requests` (= max concurrent sequences) are
written so the engine never grows the KV cache past what the memory plan counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from orchestrator.engine.config import ClusterConfig
from orchestrator.planner.result import Plan


def engine_address(host: str, port: int) -> str:
    """'ip:port', IPv6 in brackets (the engine's address syntax)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def plan_to_cluster_config(plan: Plan, cluster_name: str, *, hosts: Mapping[str, str] | None = None,
                           **cluster: object) -> ClusterConfig:
    """The ClusterConfig of a plan.

    `hosts` maps node id to the IP its peers reach it at, overriding the plan's NodeFacts.host;
    every node needs one. A plan whose transport binds elsewhere (thunderbolt: the nodes'
    Thunderbolt-bridge addresses) uses those addresses before either. Extra `cluster` keys
    (secret_file, prefill_step_size, max_batch, ...) go into the [cluster] table. Raises
    ValueError (ConfigError or pydantic's ValidationError) when the result is not a valid cluster.
    """
    hosts = dict(hosts or {})

    def host_of(node_id: str, fallback: str | None) -> str:
        chosen = plan.transport.host_of(node_id) if plan.transport and plan.transport.used != "tcp" else None
        host = chosen or hosts.get(node_id, fallback)
        if not host:
            raise ValueError(f"no address for node {node_id!r}: pass hosts={{{node_id!r}: 'IP'}}")
        return host

    coordinator = plan.coordinator
    nodes: list[dict[str, object]] = [{
        "id": "coordinator",
        "address": engine_address(host_of(coordinator.node_id, coordinator.host), coordinator.transport_port),
        "role": "hybrid",
    }]
    prompt_cache = min(s.prompt_cache_bytes for s in plan.stages)
    for s in plan.stages:
        if s.transport_port is None:
            raise ValueError(f"stage {s.stage} has no transport port")
        # the stage's own share: the coordinator's overhead on stage 0's node is another process's
        share = s.weight_bytes + s.kv_cache_bytes + prompt_cache + plan.settings.stage_overhead_bytes
        nodes.append({"id": f"stage-{s.stage}", "address": engine_address(host_of(s.node_id, s.host), s.transport_port),
                      "role": "pipeline_stage", "stage": s.stage, "layers": s.layers, "memory_bytes": share})
    table: dict[str, object] = {
        "name": cluster_name,
        "pipeline_parallel_size": len(plan.stages),
        "tensor_parallel_size": 1,
        "transport_backend": plan.settings.transport_backend,
        "context_length": plan.settings.context_length,
        "max_requests": plan.settings.max_concurrent_sequences,
        # one budget for every stage (the engine's setting): what the tightest stage can spare
        "prompt_cache_bytes": prompt_cache,
        "speculative_tokens": plan.settings.speculative_tokens,
        **({"draft_model": plan.settings.draft_model} if plan.settings.draft_model else {}),
        **cluster,
    }
    return ClusterConfig.model_validate({"cluster": table, "nodes": nodes})


def render_cluster_toml(config: ClusterConfig) -> str:
    """TOML text of a ClusterConfig; `tomllib.loads` of it validates back to an equal config."""
    lines = ["[cluster]"]
    lines += [f"{key} = {_value(value)}" for key, value in config.cluster.model_dump(exclude_none=True).items()]
    for node in config.nodes:
        lines += ["", "[[nodes]]"]
        lines += [f"{key} = {_value(value)}" for key, value in node.model_dump(exclude_none=True).items()]
    return "\n".join(lines) + "\n"


def _value(value: object) -> str:
    """A TOML scalar. JSON's string escapes (\\", \\\\, \\n, \\uXXXX) are valid in TOML basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def plan_to_cluster_toml(plan: Plan, cluster_name: str, *, hosts: Mapping[str, str] | None = None,
                         **cluster: object) -> str:
    """The cluster TOML text of a plan (see plan_to_cluster_config)."""
    return render_cluster_toml(plan_to_cluster_config(plan, cluster_name, hosts=hosts, **cluster))
