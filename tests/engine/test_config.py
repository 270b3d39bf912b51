"""The cluster TOML (docs/configuration.md, "The cluster TOML"): the documented example parses, every broken file gets a
ConfigError whose message says what is wrong, and the secret comes only from the
environment or the secret file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.engine.config import (
    SECRET_ENV,
    ClusterConfig,
    ConfigError,
    load_config,
    parse_address,
    parse_layers,
    read_secret,
)

CLUSTER = """\
[cluster]
name = "smollm2-2stage"
pipeline_parallel_size = 2
tensor_parallel_size = 1
transport_backend = "tcp"          # tcp | thunderbolt | rdma (falls back to tcp)
"""

COORDINATOR = """
[[nodes]]
id = "coordinator"
address = "127.0.0.1:39600"        # ip:port literal
role = "hybrid"
"""


def stage(node_id: str = "stage-0", address: str = "127.0.0.1:39601", index: int | None = 0,
          layers: str | None = "0-14", role: str = "pipeline_stage", extra: str = "") -> str:
    """One [[nodes]] table for a stage."""
    text = f'\n[[nodes]]\nid = "{node_id}"\naddress = "{address}"\nrole = "{role}"\n'
    if index is not None:
        text += f"stage = {index}\n"
    if layers is not None:
        text += f'layers = "{layers}"\n'
    return text + extra


STAGE0 = stage()
STAGE1 = stage("stage-1", "127.0.0.1:39602", 1, "15-29")
# The example of the docs/configuration.md's "The cluster TOML", verbatim in content.
EXAMPLE = CLUSTER + COORDINATOR + STAGE0 + STAGE1


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def test_the_design_example_parses(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE))
    assert config.cluster.name == "smollm2-2stage"
    assert config.cluster.pipeline_parallel_size == 2
    assert config.cluster.transport_backend == "tcp"
    assert [n.id for n in config.stages] == ["stage-0", "stage-1"]
    assert [n.layer_range for n in config.stages] == [(0, 15), (15, 30)]
    assert [n.host_port for n in config.stages] == [("127.0.0.1", 39601), ("127.0.0.1", 39602)]
    assert config.num_layers == 30
    assert config.node("coordinator").role == "hybrid"
    # defaults of our own keys
    assert config.cluster.max_frame_bytes == 256 * 1024 * 1024
    assert config.cluster.secret_file is None


def test_stages_are_ordered_by_stage_number_not_file_order(tmp_path):
    config = load_config(write(tmp_path, CLUSTER + STAGE1 + COORDINATOR + STAGE0))
    assert [n.id for n in config.stages] == ["stage-0", "stage-1"]


def test_single_layer_ranges_and_ipv6_addresses(tmp_path):
    text = (CLUSTER.replace("pipeline_parallel_size = 2", "pipeline_parallel_size = 3") + COORDINATOR
            + stage("a", "[::1]:39601", 0, "0") + stage("b", "[::1]:39602", 1, "1-28")
            + stage("c", "[::1]:39603", 2, "29"))
    config = load_config(write(tmp_path, text))
    assert [n.layer_range for n in config.stages] == [(0, 1), (1, 29), (29, 30)]
    assert config.stages[0].host_port == ("::1", 39601)


def test_node_lookup_names_the_known_ids(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE))
    with pytest.raises(ConfigError, match=r"no node 'stage-9'.*coordinator, stage-0, stage-1"):
        config.node("stage-9")


INVALID = [
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", 1, "16-29"),
                 r"stage-1: layers start at 16, expected 15 \(ranges must be contiguous\)", id="layer-gap"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", 1, "14-29"),
                 r"stage-1: layers start at 14, expected 15", id="layer-overlap"),
    pytest.param(CLUSTER + COORDINATOR + stage(layers="1-14") + STAGE1,
                 r"stage-0: layers start at 1, expected 0", id="layers-not-from-zero"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", 2, "15-29"),
                 r"stages must be numbered 0\.\.N-1 without gaps", id="stage-number-gap"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", 0, "15-29"),
                 r"stages must be numbered 0\.\.N-1 without gaps", id="stage-number-twice"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", None, "15-29"),
                 r"stage-1: a pipeline_stage needs 'stage' and 'layers'", id="stage-number-missing"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-1", "127.0.0.1:39602", 1, None),
                 r"stage-1: a pipeline_stage needs 'stage' and 'layers'", id="layers-missing"),
    pytest.param(CLUSTER.replace("pipeline_parallel_size = 2", "pipeline_parallel_size = 3") + COORDINATOR + STAGE0
                 + STAGE1, r"pipeline_parallel_size is 3 but 2 stage nodes are listed", id="pp-size-too-big"),
    pytest.param(CLUSTER.replace("pipeline_parallel_size = 2", "pipeline_parallel_size = 1") + COORDINATOR + STAGE0
                 + STAGE1, r"pipeline_parallel_size is 1 but 2 stage nodes are listed", id="pp-size-too-small"),
    pytest.param(CLUSTER.replace("pipeline_parallel_size = 2", "pipeline_parallel_size = 0") + COORDINATOR + STAGE0
                 + STAGE1, r"pipeline_parallel_size\s+Input should be greater than or equal to 1", id="pp-size-zero"),
    pytest.param(CLUSTER + COORDINATOR + stage(address="localhost:39601") + STAGE1,
                 r"address 'localhost:39601': expected an IP literal and a port", id="hostname"),
    pytest.param(CLUSTER + COORDINATOR + stage(address="stage0.lan:39601") + STAGE1,
                 r"address 'stage0.lan:39601': expected an IP literal", id="fqdn"),
    pytest.param(CLUSTER + COORDINATOR + stage(address="127.0.0.1:70000") + STAGE1,
                 r"address '127.0.0.1:70000': port out of range", id="port-too-big"),
    pytest.param(CLUSTER + COORDINATOR + stage(address="127.0.0.1:0") + STAGE1,
                 r"address '127.0.0.1:0': port out of range", id="port-zero"),
    pytest.param(CLUSTER + COORDINATOR + stage(address="127.0.0.1") + STAGE1,
                 r"address '127.0.0.1': expected ip:port", id="no-port"),
    pytest.param(CLUSTER + COORDINATOR.replace("127.0.0.1:39600", "coordinator:39600") + STAGE0 + STAGE1,
                 r"address 'coordinator:39600': expected an IP literal", id="coordinator-hostname"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + stage("stage-0", "127.0.0.1:39602", 1, "15-29"),
                 r"node ids must be unique", id="duplicate-id"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + STAGE1.replace('id = "stage-1"', 'id = "coordinator"'),
                 r"node ids must be unique", id="duplicate-id-across-roles"),
    pytest.param(CLUSTER + STAGE0 + STAGE1,
                 r"exactly one node must have role 'hybrid' or 'coordinator'", id="no-coordinator"),
    pytest.param(CLUSTER + COORDINATOR + COORDINATOR.replace('"coordinator"', '"coordinator-2"')
                 .replace("127.0.0.1:39600", "127.0.0.1:39609") + STAGE0 + STAGE1,
                 r"exactly one node must have role 'hybrid' or 'coordinator'", id="two-coordinators"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + STAGE1.replace("127.0.0.1:39602", "127.0.0.1:39601"),
                 r"two nodes share an address", id="shared-address"),
    pytest.param(CLUSTER.replace("tensor_parallel_size = 1", "tensor_parallel_size = 2") + COORDINATOR + STAGE0
                 + STAGE1, r"tensor_parallel_size must be 1 \(pipeline parallelism only\)", id="tensor-parallel"),
    pytest.param(CLUSTER + "pipline_parallel = 2\n" + COORDINATOR + STAGE0 + STAGE1,
                 r"cluster\.pipline_parallel\s+Extra inputs are not permitted", id="unknown-cluster-key"),
    pytest.param(CLUSTER + COORDINATOR + stage(extra="layer = \"0-14\"\n") + STAGE1,
                 r"nodes\.1\.layer\s+Extra inputs are not permitted", id="unknown-node-key"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0 + STAGE1 + "\n[extras]\nx = 1\n",
                 r"extras\s+Extra inputs are not permitted", id="unknown-table"),
    pytest.param(CLUSTER + COORDINATOR + stage(layers="5-3") + STAGE1,
                 r"layers '5-3': need 0 <= FIRST <= LAST", id="layers-reversed"),
    pytest.param(CLUSTER + COORDINATOR + stage(layers="0..14") + STAGE1,
                 r"layers '0\.\.14': expected 'FIRST-LAST' \(inclusive\)", id="layers-syntax"),
    pytest.param(CLUSTER + COORDINATOR + stage(role="worker") + STAGE1,
                 r"nodes\.1\.role\s+Input should be 'hybrid', 'coordinator' or 'pipeline_stage'", id="unknown-role"),
    pytest.param(CLUSTER.replace('"tcp"', '"carrier-pigeon"') + COORDINATOR + STAGE0 + STAGE1,
                 r"transport_backend\s+Input should be 'tcp', 'thunderbolt' or 'rdma'", id="unknown-backend"),
    pytest.param(CLUSTER + "max_frame_bytes = 100\n" + COORDINATOR + STAGE0 + STAGE1,
                 r"max_frame_bytes\s+Input should be greater than or equal to 4096", id="tiny-frame-limit"),
    pytest.param(CLUSTER + COORDINATOR + STAGE0.replace("stage = 0", "stage = -1") + STAGE1,
                 r"nodes\.1\.stage\s+Input should be greater than or equal to 0", id="negative-stage"),
    pytest.param(COORDINATOR + STAGE0, r"cluster\s+Field required", id="no-cluster-table"),
    pytest.param(CLUSTER + "name = \n", r"cluster\.toml: .*Invalid value", id="toml-syntax"),
]


@pytest.mark.parametrize("text,message", INVALID)
def test_invalid_config_is_a_config_error_with_a_specific_message(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert re.search(message, str(info.value)), f"message {str(info.value)!r} does not match {message!r}"
    assert str(path) in str(info.value), "the message names the file"


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: .*No such file"):
        load_config(tmp_path / "nope.toml")


def test_layer_range_of_a_node_without_layers_is_a_config_error(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE))
    with pytest.raises(ConfigError, match=r"node 'coordinator' has no layers"):
        _ = config.node("coordinator").layer_range


@pytest.mark.parametrize("text,expected", [
    ("0-14", (0, 15)), ("15-29", (15, 30)), ("7", (7, 8)), ("0-0", (0, 1)), (" 3-5 ", (3, 6)),
])
def test_parse_layers(text, expected):
    assert parse_layers(text) == expected


@pytest.mark.parametrize("text,message", [
    ("5-3", r"need 0 <= FIRST <= LAST"),
    ("", r"expected 'FIRST-LAST'"),
    ("-5", r"expected 'FIRST-LAST'"),
    ("1-2-3", r"expected 'FIRST-LAST'"),
    ("a-b", r"expected 'FIRST-LAST'"),
    ("0-", r"expected 'FIRST-LAST'"),
    ("1.5-3", r"expected 'FIRST-LAST'"),
    ("0-1_4", r"expected 'FIRST-LAST'"),
    ("+3", r"expected 'FIRST-LAST'"),
])
def test_parse_layers_rejects(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_layers(text)


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:39601", ("127.0.0.1", 39601)),
    ("0.0.0.0:1", ("0.0.0.0", 1)),
    ("10.1.2.3:65535", ("10.1.2.3", 65535)),
    ("[::1]:39601", ("::1", 39601)),
    ("[fe80::1:80]:9000", ("fe80::1:80", 9000)),
])
def test_parse_address(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text,message", [
    ("localhost:80", r"expected an IP literal"),
    ("example.com:80", r"expected an IP literal"),
    ("127.0.0.1", r"expected ip:port"),
    ("", r"expected ip:port"),
    ("127.0.0.1:", r"expected an IP literal and a port"),
    ("127.0.0.1:http", r"expected an IP literal and a port"),
    ("127.0.0.1:65536", r"port out of range"),
    ("127.0.0.1:0", r"port out of range"),
    ("127.0.0.1:-1", r"expected an IP literal and a port"),
    ("127.0.0.1:8_0", r"expected an IP literal and a port"),
    ("127.0.0.1: 80", r"expected an IP literal and a port"),
    ("256.0.0.1:80", r"expected an IP literal"),
    (":80", r"expected an IP literal"),
    # an unbracketed IPv6 literal is ambiguous: is "fe80::1:80" the host fe80::1 on port 80,
    # or the address fe80::1:80 with the port forgotten?
    ("fe80::1:80", r"IPv6 literals go in brackets"),
    ("::1:39601", r"IPv6 literals go in brackets"),
    ("[127.0.0.1]:80", r"expected an IP literal"),
])
def test_parse_address_rejects(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_address(text)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --- the secret ------------------------------------------------------------------------

def _config_with_secret_file(tmp_path: Path, name: str | None) -> tuple[ClusterConfig, Path]:
    text = CLUSTER + (f'secret_file = "{name}"\n' if name else "") + COORDINATOR + STAGE0 + STAGE1
    path = write(tmp_path, text)
    return load_config(path), path


def test_secret_from_the_environment(tmp_path):
    config, path = _config_with_secret_file(tmp_path, None)
    assert read_secret(config, path, env={SECRET_ENV: "s3cret"}) == b"s3cret"


def test_secret_from_os_environ_by_default(tmp_path, monkeypatch):
    config, path = _config_with_secret_file(tmp_path, None)
    monkeypatch.setenv(SECRET_ENV, "from-os-environ")
    assert read_secret(config, path) == b"from-os-environ"
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ConfigError, match="no cluster secret"):
        read_secret(config, path)


def test_secret_file_relative_to_the_config_and_stripped(tmp_path):
    (tmp_path / "cluster.secret").write_text("  file-secret\n")
    config, path = _config_with_secret_file(tmp_path, "cluster.secret")
    assert read_secret(config, path, env={}) == b"file-secret"


def test_environment_wins_over_the_secret_file(tmp_path):
    (tmp_path / "cluster.secret").write_text("file-secret\n")
    config, path = _config_with_secret_file(tmp_path, "cluster.secret")
    assert read_secret(config, path, env={SECRET_ENV: "env-secret"}) == b"env-secret"
    # an empty variable does not count as set
    assert read_secret(config, path, env={SECRET_ENV: ""}) == b"file-secret"


def test_missing_secret_file_is_a_clear_error(tmp_path):
    config, path = _config_with_secret_file(tmp_path, "absent.secret")
    with pytest.raises(ConfigError, match=r"secret_file .*absent\.secret: .*No such file"):
        read_secret(config, path, env={})


def test_empty_secret_file_is_no_secret(tmp_path):
    (tmp_path / "cluster.secret").write_text("\n \n")
    config, path = _config_with_secret_file(tmp_path, "cluster.secret")
    with pytest.raises(ConfigError, match=f"no cluster secret: set {SECRET_ENV} or name a secret_file"):
        read_secret(config, path, env={})


def test_no_secret_at_all_is_a_clear_error(tmp_path):
    config, path = _config_with_secret_file(tmp_path, None)
    with pytest.raises(ConfigError, match=f"no cluster secret: set {SECRET_ENV} or name a secret_file"):
        read_secret(config, path, env={})
