"""Request and response bodies of the agent's HTTP API (documented in docs/agent-api.md).

Shared by the server (validation) and the client (parsing), so both ends agree by
construction. Requests forbid unknown fields: a typo is an error, not a silent default.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from orchestrator.agent.device_schemas import Memory, Runtime
from orchestrator.agent.names import check_id, check_model_id, check_relpath
from orchestrator.agent.perf_schemas import ComputeProfile, LinkSample, NetInterface
from orchestrator.models.describe import ModelDescription

API_VERSION = 1
MAX_MANIFEST_FILES = 10_000
SHA256 = r"^[0-9a-f]{64}$"
MAX_BLOCKS = 4096  # per file (this agent writes at most blocks.MAX_BLOCKS)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- identity and pairing -------------------------------------------------------------

class Identity(BaseModel):
    """GET /v1/identity (no credential needed): enough to recognise a node, nothing more."""

    name: str
    fingerprint: str
    version: str
    api: int = API_VERSION


class PairRequest(_Request):
    token: str = Field(min_length=1, max_length=256)
    label: str = Field(default="", max_length=128)


class PairResponse(BaseModel):
    credential: str
    credential_id: str
    name: str
    fingerprint: str


# --- models -----------------------------------------------------------------------------

class Blocks(BaseModel):
    """The sha256 of each `size`-byte block of a file, in order (see `blocks`)."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(ge=1 << 20, le=1 << 40)
    sha256: list[Annotated[str, Field(pattern=SHA256)]] = Field(min_length=2, max_length=MAX_BLOCKS)


class FileEntry(BaseModel):
    """A file's size and sha256, and, for files of several blocks, the blocks' sha256 (`blocks`).

    Equal entries are the same content: size and sha256 decide, blocks are an index of it.
    An entry without blocks is written without the key (as older agents expect it).
    """

    model_config = ConfigDict(extra="forbid")

    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)
    blocks: Blocks | None = None

    @model_validator(mode="after")
    def _blocks_cover_the_file(self) -> "FileEntry":
        if self.blocks is not None and len(self.blocks.sha256) != -(-self.size // self.blocks.size):
            raise ValueError(f"{len(self.blocks.sha256)} blocks of {self.blocks.size} bytes do not cover "
                             f"{self.size} bytes")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_blocks(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("blocks", 0) is None:
            del data["blocks"]
        return data

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FileEntry):
            return NotImplemented
        return self.size == other.size and self.sha256 == other.sha256


class Manifest(BaseModel):
    """Per-file size and sha256 of a model directory, keyed by relative path ("a/b.json")."""

    model_config = ConfigDict(extra="forbid")

    files: dict[str, FileEntry]

    @field_validator("files")
    @classmethod
    def _paths(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        if len(files) > MAX_MANIFEST_FILES:
            raise ValueError(f"more than {MAX_MANIFEST_FILES} files")
        for path in files:
            check_relpath(path)
        return files

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        return sum(f.size for f in self.files.values())


class ModelInfo(BaseModel):
    """One model directory as the node sees it."""

    id: str
    mlx_format: bool
    reason: str | None = None  # why it is not usable as MLX, when mlx_format is false
    model_type: str | None = None
    family: str | None = None  # first of config.json "architectures", e.g. LlamaForCausalLM
    # The engine's support registry (orchestrator/families/support.py): supported means it is
    # an MLX directory of a family, format and quantization the split engine serves exactly;
    # otherwise unsupported_reason says why (or, for a directory that is not MLX at all, reason).
    supported: bool = False
    unsupported_reason: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    dtype: str | None = None
    quantization: str | None = None  # e.g. "4-bit, group 64"; None when not quantized
    total_bytes: int = 0
    file_count: int = 0
    ignored: list[str] = []  # entries not served or hashed (symlinks leaving the directory, ...)
    manifest: Manifest | None = None
    description: ModelDescription | None = None  # layer/embedding/head bytes, KV geometry (for the planner)


class ModelList(BaseModel):
    models: list[ModelInfo]


class CheckRequest(_Request):
    manifest: Manifest
    rehash: bool = False  # hash every file again instead of trusting the (size, mtime) cache


class CheckResult(BaseModel):
    """Present / Needs download / Mismatch of one model against an expected manifest."""

    model_id: str
    status: Literal["present", "needs_download", "mismatch"]
    missing: list[str] = []
    mismatched: list[str] = []  # present with other size or sha256
    unexpected: list[str] = []  # present here, absent from the manifest
    message: str


class TicketRequest(_Request):
    ttl_s: int = Field(default=3600, ge=10, le=86_400)


class TicketResponse(BaseModel):
    """A read-only credential for one model's files, handed by the control plane to a peer."""

    ticket: str
    model_id: str
    expires_in_s: int


# --- downloads --------------------------------------------------------------------------

_PEER_URL = re.compile(r"http://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})):([0-9]{1,5})/?")


def _peer_url(value: str) -> str:
    """`value` if it is http://host:port (host a name, an IPv4 or a bracketed IPv6), else ValueError."""
    m = _PEER_URL.fullmatch(value)
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError("must be http://host:port of the peer agent (no path, query, fragment or user info)")
    if m.group(1).startswith("["):
        ipaddress.IPv6Address(m.group(1)[1:-1])  # ValueError when it is not one
    return value


class PeerSource(_Request):
    kind: Literal["peer"]
    # The peer agent's root, exactly http://host:port[/]: no path, query, fragment or user info,
    # so the agent builds every URL it requests itself (see _peer_url).
    url: str = Field(max_length=256)
    ticket: str = Field(min_length=16, max_length=256)  # from the peer's POST .../tickets
    model_id: str | None = None  # the model's id on the peer (default: the same id)
    # Further peers holding the same files: the copy takes files (or byte ranges of large
    # files) from all of them at once; every byte is still checked against the manifest.
    mirrors: list["PeerMirror"] = Field(default=[], max_length=8)
    # Copy the files the peer offers while its own download still runs, each once the peer has
    # verified it, until the peer holds the whole model (no manifest, no mirrors: the peer's
    # verified files are the manifest, every byte still checked against their sha256).
    follow: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _peer_url(value)

    @field_validator("model_id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else check_model_id(value)


class PeerMirror(_Request):
    """Another peer agent holding the same model (a PeerSource without kind and mirrors)."""

    url: str = Field(max_length=256)
    ticket: str = Field(min_length=16, max_length=256)
    model_id: str | None = None

    _url = field_validator("url")(classmethod(lambda cls, value: _peer_url(value)))
    _id = field_validator("model_id")(classmethod(lambda cls, value: None if value is None else check_model_id(value)))


class HubSource(_Request):
    kind: Literal["hf"]
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
    revision: str = Field(default="main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


class DemoSource(_Request):
    kind: Literal["demo"]
    dtype: Literal["float32", "bfloat16"] = "float32"


Source = Annotated[PeerSource | HubSource | DemoSource, Field(discriminator="kind")]


class FetchRequest(_Request):
    source: Source
    # Required from a peer; optional from the hub and the demo import (then the files are
    # hashed after download and that becomes the model's manifest).
    manifest: Manifest | None = None


class OfferedFiles(BaseModel):
    """The files of a model a node serves to peers (`GET /v1/models/{id}/files`): all of them once
    it holds the model, or those its running download has verified so far."""

    model_id: str
    state: Literal["present", "running", "failed", "cancelled"]
    complete: bool  # `manifest` is the whole model
    manifest: Manifest
    total_bytes: int  # of the whole model, when known (0 before a hub listing came back)
    files_total: int


class DownloadInfo(BaseModel):
    """Progress of one model's download (the latest job per model id)."""

    model_id: str
    source: str
    state: Literal["running", "done", "failed", "cancelled"]
    total_bytes: int
    done_bytes: int  # verified or in progress, including what a resume found on disk
    transferred_bytes: int  # over the network in this job (a resume transfers less)
    resumed_bytes: int  # taken from an earlier interrupted attempt
    reused_bytes: int  # identical files copied from the local model instead of downloaded
    rate_bps: float
    current_file: str | None
    files_total: int
    files_done: int
    error: str | None = None
    error_code: str | None = None
    mismatched: list[str] = []  # files whose sha256 differed from the manifest (after a retry)
    elapsed_s: float


class DownloadList(BaseModel):
    downloads: list[DownloadInfo]


class CancelRequest(_Request):
    discard: bool = False  # also delete the partial files (default: keep them for a resume)


# --- engine processes -----------------------------------------------------------------

class StartProcessRequest(_Request):
    """Start `pipeserve stage` or `pipeserve coordinator`: never an arbitrary command."""

    kind: Literal["stage", "coordinator"]
    cluster_id: str
    node_id: str
    model_id: str
    config: str = Field(min_length=1, max_length=65_536)  # the cluster TOML (docs/configuration.md, "The cluster TOML")
    secret: str = Field(min_length=16, max_length=512)  # passed to the child in its environment
    lease_s: float = Field(default=30.0, ge=1.0, le=3600.0)
    http_host: str | None = None  # coordinator only
    http_port: int | None = Field(default=None, ge=1, le=65535)  # coordinator only (required)
    threads: int | None = Field(default=None, ge=1, le=256)  # stage only: BLAS threads
    model_name: str | None = Field(default=None, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")

    @field_validator("cluster_id", "node_id")
    @classmethod
    def _ids(cls, value: str) -> str:
        return check_id(value)

    @field_validator("model_id")
    @classmethod
    def _model(cls, value: str) -> str:
        return check_model_id(value)

    @field_validator("http_host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None:
            ipaddress.ip_address(value)  # an IP literal: it becomes an argument of the coordinator
        return value


class ProcessInfo(BaseModel):
    cluster_id: str
    node_id: str
    kind: str
    model_id: str
    pid: int | None
    alive: bool
    exit_code: int | None = None  # set when it exited by itself with a status
    signal: str | None = None  # set when a signal ended it (e.g. SIGTERM)
    port: int  # the stage's transport port, or the coordinator's HTTP port
    port_listening: bool
    started_at: float  # unix time
    uptime_s: float
    lease_remaining_s: float | None  # None once the process is gone
    stop_reason: str | None = None  # "requested", "lease expired", "agent shutdown", ...
    adopted: bool = False  # found running after an agent restart (exit status then unknown)
    created: bool = False  # in a start answer: false when an identical process was already running
    cpu_s: float | None = None  # CPU seconds it has used (None where unreadable): busy or stuck (proc/cputime.py)


class ProcessList(BaseModel):
    processes: list[ProcessInfo]


class StopRequest(_Request):
    timeout_s: float = Field(default=10.0, ge=0.0, le=120.0)  # SIGTERM grace before SIGKILL


class LeaseRequest(_Request):
    lease_s: float = Field(default=30.0, ge=1.0, le=3600.0)


class LeaseResponse(BaseModel):
    cluster_id: str
    lease_s: float
    renewed: list[str]  # node ids whose lease was extended


class LogsResponse(BaseModel):
    cluster_id: str
    node_id: str
    lines: list[str]


# --- the node report ----------------------------------------------------------------

class Accelerator(BaseModel):
    family: Literal["apple-silicon", "linux-cuda", "linux-cpu", "other"]
    detail: str


class Ports(BaseModel):
    start: int
    end: int
    free: list[int]


class Report(BaseModel):
    name: str
    fingerprint: str
    version: str
    accelerator: Accelerator
    versions: dict[str, str | None]
    platform: dict[str, str]
    memory: Memory  # agent/device_schemas.py: which quantity it is (memory.kind)
    runtime: Runtime | None = None  # mlx's backend and versions; None from agents that predate it
    disk_free_bytes: int  # on the models directory's file system
    transport_ports: Ports
    models: list[ModelInfo]
    processes: list[ProcessInfo]
    downloads: list[DownloadInfo]
    # Performance facts (agent/perf_schemas.py); empty from agents that predate them.
    interfaces: list[NetInterface] = []
    links: list[LinkSample] = []  # the last measurement to each peer it was asked to probe
    compute: list[ComputeProfile] = []  # cached timings of its models' layers
