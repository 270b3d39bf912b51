"""Verify against a real agent: a copy placed by hand is Not verified until Verify hashes every
file again (sha256) against the node's manifest; a file that changes makes it Not verified at
the node's next report; nothing is faked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.control.core import Orchestrator
from orchestrator.control.rules.commands import CommandRefused
from orchestrator.control.rules.verification import verified_holders
from orchestrator.registrar import ConfigFileRegistrar

WAIT = 60.0  # seconds: a loaded 2-core machine; each wait ends as soon as its condition holds


@pytest.fixture
def env(spawn_agent, test_model_dir: Path, tmp_path: Path):
    agent = spawn_agent("node-a")
    shutil.copytree(test_model_dir, agent.models_dir / "tiny")  # placed by hand
    (tmp_path / "router.yaml").write_text("backends: []\n")
    orch = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml")).start()
    node = orch.register_node(agent.url, agent.token)
    orch.wait(lambda st: st.node(node.id).report is not None
              and any(m.id == "tiny" for m in st.node(node.id).report.models), WAIT)
    yield orch, agent, node.id
    orch.stop()


def test_verify_a_copy_placed_by_hand_then_a_changed_byte_unverifies_it(env):
    orch, agent, nid = env
    assert verified_holders(orch.state, "tiny") == set()
    orch.models.verify("tiny", nid)
    try:
        orch.models.verify("tiny", nid)
    except CommandRefused as exc:  # unless the first finished already
        assert "already being verified" in str(exc)
    st = orch.wait(lambda s: any(c.phase != "running" for c in s.checks), WAIT)
    assert [c.phase for c in st.checks] == ["verified"], st.checks
    assert verified_holders(st, "tiny") == {nid}
    assert st.checks[0].message == "checked by Verify: every file hashed again matches its manifest"
    # a file added by hand: the node's next report differs, the copy is no longer what was verified
    (agent.models_dir / "tiny" / "notes.txt").write_text("edited by hand")
    orch.wait(lambda s: verified_holders(s, "tiny") == set(), WAIT)
