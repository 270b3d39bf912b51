"""The node registry: discovery is a hint, registration needs the pairing token, all persisted."""

from __future__ import annotations

import signal

import pytest

from orchestrator.control.core import CommandRefused, Orchestrator
from orchestrator.control.rules.state import Settings
from orchestrator.registrar import ConfigFileRegistrar


@pytest.fixture
def orch(tmp_path):
    (tmp_path / "router.yaml").write_text("backends: []\n")
    made = []

    def make(**kw) -> Orchestrator:
        o = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml"), **kw).start()
        made.append(o)
        return o

    yield make
    for o in made:
        o.stop()


def test_discovered_nodes_need_the_pairing_token_and_vanish_when_they_leave(spawn_agent, orch):
    a = spawn_agent("disc-a", advertise=True)
    b = spawn_agent("disc-b", "--advertise-ttl", "3", advertise=True)
    o = orch(discovery=True, discovery_interfaces=["127.0.0.1"])
    st = o.wait(lambda st: {d.name for d in st.discovered} >= {"disc-a", "disc-b"}, 20)
    found = next(d for d in st.discovered if d.name == "disc-a")
    assert found.url == a.url
    with pytest.raises(CommandRefused, match="could not register"):
        o.register_node(found.url, "not-the-token")
    assert o.state.node(found.fingerprint) is None
    node = o.register_node(found.url, a.token)
    st = o.wait(lambda st: all(d.name != "disc-a" for d in st.discovered), 5)
    assert st.node(node.id).name == "disc-a"
    b.stop(signal.SIGTERM)  # a goodbye: forgotten at once
    o.wait(lambda st: all(d.name != "disc-b" for d in st.discovered), 15)


def test_registry_and_settings_survive_a_restart_and_bad_input_changes_nothing(spawn_agent, orch):
    a = spawn_agent("keep")
    o = orch()
    with pytest.raises(CommandRefused, match="expected host:port"):
        o.register_node("no-port-here", a.token)
    with pytest.raises(CommandRefused, match="start must not exceed end"):
        o.update_settings(Settings(port_start=39700, port_end=39600))
    before = o.state.version
    assert o.state.nodes == () and o.state.version == before
    node = o.register_node(a.url.replace("http://", ""), a.token)
    o.update_settings(Settings(distributed_enabled=True, transport_backend="rdma", port_start=40000, port_end=40009))
    o.stop()
    o2 = orch()
    assert o2.state.settings.port_start == 40000 and o2.state.settings.transport_backend == "rdma"
    assert [n.id for n in o2.state.nodes] == [node.id]
    st = o2.wait(lambda st: st.node(node.id).status == "reachable", 10)  # the watcher sees it again
    assert st.node(node.id).report.name == "keep"
    import os
    import stat

    mode = stat.S_IMODE(os.stat(o2.state_dir / "control.json").st_mode)
    assert mode == 0o600  # it holds the nodes' credentials
