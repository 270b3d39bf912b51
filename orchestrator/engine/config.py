"""The cluster TOML (docs/configuration.md, "The cluster TOML"): which node runs which stage, on which address.

Pure parsing and validation; the only I/O is reading the file and the secret.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator import settings

SECRET_ENV = settings.CLUSTER_SECRET.name
DEFAULT_PROMPT_CACHE_BYTES = 1 << 30


class ConfigError(ValueError):
    """The cluster configuration is unusable; the message says where and why."""


def _decimal(text: str) -> int:
    """A plain non-negative decimal: int() alone would also take "+3", " 3" and "1_0"."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def parse_layers(text: str) -> tuple[int, int]:
    """Parse an inclusive mlxcel-style range "0-14" (or "7") into half-open (start, end)."""
    parts = text.strip().split("-")
    try:
        if len(parts) == 1:
            first = last = _decimal(parts[0].strip())
        elif len(parts) == 2:
            first, last = _decimal(parts[0].strip()), _decimal(parts[1].strip())
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"layers {text!r}: expected 'FIRST-LAST' (inclusive), e.g. '0-14'") from None
    if first < 0 or last < first:
        raise ConfigError(f"layers {text!r}: need 0 <= FIRST <= LAST")
    return first, last + 1


def parse_address(text: str) -> tuple[str, int]:
    """Parse an 'ip:port' literal (IPv6 as '[::1]:port') into (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ConfigError(f"address {text!r}: expected ip:port")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if ":" in host and not bracketed:
        raise ConfigError(f"address {text!r}: IPv6 literals go in brackets, e.g. [::1]:39601")
    try:
        if ipaddress.ip_address(host).version == 4 and bracketed:
            raise ValueError
        port = _decimal(port_text)
    except ValueError:
        raise ConfigError(f"address {text!r}: expected an IP literal and a port, e.g. 127.0.0.1:39601") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"address {text!r}: port out of range")
    return host, port


class NodeSpec(BaseModel):
    """One `[[nodes]]` entry."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)
    address: str
    role: Literal["hybrid", "coordinator", "pipeline_stage"]
    stage: int | None = Field(default=None, ge=0)
    layers: str | None = None
    # A stage's share of its node's accelerator memory (weights, KV cache, prompt cache, overhead), as the
    # plan counted it: the stage sets mlx's memory (and Metal's wired) limit to it (stage/memory_share.py).
    memory_bytes: int | None = Field(default=None, ge=1)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address(value)
        return value

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: str | None) -> str | None:
        if value is not None:
            parse_layers(value)
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        """The (host, port) this node binds or is reached at."""
        return parse_address(self.address)

    @property
    def layer_range(self) -> tuple[int, int]:
        """Half-open (start, end) of the layers this stage owns."""
        if self.layers is None:
            raise ConfigError(f"node {self.id!r} has no layers")
        return parse_layers(self.layers)


class ClusterSpec(BaseModel):
    """The `[cluster]` table."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    pipeline_parallel_size: int = Field(ge=1)
    tensor_parallel_size: int = 1
    transport_backend: Literal["tcp", "thunderbolt", "rdma"] = "tcp"
    secret_file: str | None = None
    prefill_step_size: int = Field(default=2048, ge=1)
    max_frame_bytes: int = Field(default=256 * 1024 * 1024, ge=4096)
    max_batch: int = Field(default=16, ge=1, le=256)
    max_requests: int = Field(default=64, ge=1)
    context_length: int | None = Field(default=None, ge=8)
    # A stage inside one step (or with work queued and no step done) this long is wedged;
    # default engine.watchdog.DEFAULT_STALL_TIMEOUT. Longer than the longest prefill chunk.
    stall_timeout_s: float | None = Field(default=None, gt=0)
    # Bytes of prompt-cache entries each stage may hold (docs/prompt-cache.md); 0 turns the cache off.
    # Unset: DEFAULT_PROMPT_CACHE_BYTES (the planner writes a figure sized from free memory).
    prompt_cache_bytes: int | None = Field(default=None, ge=0)
    # Bytes of prompt-cache files each stage may keep under its node's models directory (the disk
    # tier, engine/stage/disk_cache.py): a restarted stage comes back warm. 0 (default): no disk tier.
    prompt_cache_disk_bytes: int = Field(default=0, ge=0)
    # Speculative decoding (prompt lookup, engine/coordinator/drafting.py): the most tokens a request drafts
    # per pass; 0 turns it off. Off by itself for models whose caches cannot roll back (engine/stage/speculate.py).
    # Default off: the measurements so far (docs/benchmark.md, "Speculative decoding") showed no gain.
    speculative_tokens: int = Field(default=0, ge=0, le=16)
    # A small model with the served model's tokenizer drafts instead of prompt lookup
    # (engine/coordinator/draft_model.py); needs speculative_tokens > 0. A directory on the coordinator's
    # node: a relative path is taken beside the served model (a model id in the node's models directory).
    draft_model: str | None = Field(default=None, min_length=1)

    @property
    def prompt_cache_budget(self) -> int:
        """The per-stage prompt-cache budget in bytes."""
        return DEFAULT_PROMPT_CACHE_BYTES if self.prompt_cache_bytes is None else self.prompt_cache_bytes

    @model_validator(mode="after")
    def _draft(self) -> "ClusterSpec":
        if self.draft_model is not None and self.speculative_tokens == 0:
            raise ConfigError("draft_model drafts for speculative decoding: set speculative_tokens (1-16) too")
        return self

    @field_validator("tensor_parallel_size")
    @classmethod
    def _tp(cls, value: int) -> int:
        if value != 1:
            raise ConfigError("tensor_parallel_size must be 1 (pipeline parallelism only)")
        return value


class ClusterConfig(BaseModel):
    """The whole file: the cluster and its nodes, validated as a pipeline."""

    model_config = ConfigDict(extra="forbid")

    cluster: ClusterSpec
    nodes: list[NodeSpec]

    @model_validator(mode="after")
    def _pipeline(self) -> "ClusterConfig":
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError("node ids must be unique")
        addresses = [n.host_port for n in self.nodes]
        if len(set(addresses)) != len(addresses):
            raise ConfigError("two nodes share an address; every node needs its own ip:port")
        stages = self.stages
        if [s.stage for s in stages] != list(range(len(stages))):
            raise ConfigError("stages must be numbered 0..N-1 without gaps")
        if len(stages) != self.cluster.pipeline_parallel_size:
            raise ConfigError(
                f"pipeline_parallel_size is {self.cluster.pipeline_parallel_size} "
                f"but {len(stages)} stage nodes are listed"
            )
        expected = 0
        for s in stages:
            start, end = s.layer_range
            if start != expected:
                raise ConfigError(f"{s.id}: layers start at {start}, expected {expected} (ranges must be contiguous)")
            expected = end
        if sum(1 for n in self.nodes if n.role in ("hybrid", "coordinator")) != 1:
            raise ConfigError("exactly one node must have role 'hybrid' or 'coordinator'")
        return self

    @property
    def stages(self) -> list[NodeSpec]:
        """Stage nodes in pipeline order."""
        found = [n for n in self.nodes if n.role == "pipeline_stage"]
        for n in found:
            if n.stage is None or n.layers is None:
                raise ConfigError(f"{n.id}: a pipeline_stage needs 'stage' and 'layers'")
        return sorted(found, key=lambda n: n.stage or 0)

    @property
    def num_layers(self) -> int:
        """Total layers covered by the stages."""
        return self.stages[-1].layer_range[1]

    def node(self, node_id: str) -> NodeSpec:
        """The node with this id, or a ConfigError naming the ids that exist."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(f"no node {node_id!r} in config (have: {', '.join(n.id for n in self.nodes)})")


def load_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster TOML; raises ConfigError with a readable message."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return ClusterConfig.model_validate(data)
    except ConfigError:
        raise
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        raise ConfigError(f"{path}: {exc}") from None


def read_secret(config: ClusterConfig, config_path: str | os.PathLike[str], env: dict[str, str] | None = None) -> bytes:
    """The cluster secret: `PIPESERVE_CLUSTER_SECRET`, else the file named by `secret_file`.

    Never taken from the command line, where other local users could read it.
    """
    secret = settings.CLUSTER_SECRET.read(env)
    if secret:
        return secret.encode()
    if config.cluster.secret_file:
        path = Path(config_path).parent / config.cluster.secret_file
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"secret_file {path}: {exc}") from None
        if secret:
            return secret
    raise ConfigError(f"no cluster secret: set {SECRET_ENV} or name a secret_file in [cluster]")
