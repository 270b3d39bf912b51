"""Identity, pairing, credentials and tickets (in-process)."""

from __future__ import annotations

from orchestrator.agent.identity import MAX_CREDENTIALS, AgentState
from orchestrator.proc import FakeClock


def test_identity_is_stable_and_the_token_is_issued_once(tmp_path):
    first = AgentState(tmp_path / "s")
    assert first.new_pairing_token and len(first.fingerprint) == 32
    again = AgentState(tmp_path / "s")
    assert again.new_pairing_token is None and again.fingerprint == first.fingerprint
    assert AgentState(tmp_path / "other").fingerprint != first.fingerprint


def test_pairing_and_credentials(tmp_path):
    state = AgentState(tmp_path / "s")
    token = state.new_pairing_token
    assert state.pair("wrong", "x") is None
    credential, cred_id = state.pair(token, "dashboard")
    assert state.caller(credential).kind == "credential" and state.caller(credential).id == cred_id
    assert state.caller("not-a-credential") is None and state.caller("") is None
    # Restarted agent: the credential still works, the token still pairs.
    reopened = AgentState(tmp_path / "s")
    assert reopened.caller(credential) is not None and reopened.pair(token) is not None
    for path in (tmp_path / "s").iterdir():
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o600
            assert token not in path.read_text() and credential not in path.read_text()
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o700
    assert reopened.unpair(cred_id) and reopened.caller(credential) is None and not reopened.unpair(cred_id)


def test_reset_revokes_everything(tmp_path):
    state = AgentState(tmp_path / "s")
    old_token = state.new_pairing_token
    credential, _ = state.pair(old_token)
    new_token = state.reset_pairing()
    assert new_token != old_token and state.caller(credential) is None and state.pair(old_token) is None
    assert state.pair(new_token) is not None


def test_credentials_are_bounded(tmp_path):
    state = AgentState(tmp_path / "s")
    creds = [state.pair(state.new_pairing_token)[0] for _ in range(MAX_CREDENTIALS + 3)]
    assert state.caller(creds[0]) is None and state.caller(creds[-1]) is not None


def test_tickets_are_scoped_and_expire(tmp_path):
    clock = FakeClock()
    state = AgentState(tmp_path / "s", clock=clock)
    ticket = state.issue_ticket("tm", ttl_s=1.5)
    caller = state.caller(ticket)
    assert caller.kind == "ticket" and caller.model_id == "tm"
    clock.advance(1.4)
    assert state.caller(ticket).model_id == "tm"  # within its TTL
    clock.advance(0.2)
    assert state.caller(ticket) is None
    assert "ticket" not in (tmp_path / "s" / "auth.json").read_text()  # tickets live in memory only
