"""Identity, pairing, credentials and tickets (in-process)."""

from __future__ import annotations

import json

import pytest

from orchestrator.agent.identity import IN_USE_S, MAX_CREDENTIALS, NEW_GRACE_S, AgentState, CredentialsFull
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


def _age(state_dir, seconds: float, used: bool) -> None:
    """Move every stored credential `seconds` into the past (created, and last used when `used`)."""
    auth_path = state_dir / "auth.json"
    auth = json.loads(auth_path.read_text())
    for cred in auth["credentials"]:
        cred["created"] -= seconds
        if used:
            cred["used"] = cred["created"]
    auth_path.write_text(json.dumps(auth))


def test_credentials_are_bounded_and_only_stale_ones_make_room(tmp_path):
    state = AgentState(tmp_path / "s")
    token = state.new_pairing_token
    creds = [state.pair(token)[0] for _ in range(MAX_CREDENTIALS)]
    with pytest.raises(CredentialsFull, match="reset-pairing"):  # all just paired: none may go
        state.pair(token)
    assert all(state.caller(c) for c in creds)  # the refusal changed nothing (each is used now)
    # Used more recently than IN_USE_S: still in use, still refused.
    _age(tmp_path / "s", IN_USE_S - 3600, used=True)
    state = AgentState(tmp_path / "s")
    with pytest.raises(CredentialsFull):
        state.pair(token)
    # Idle past IN_USE_S: the longest idle makes room, one per pairing.
    _age(tmp_path / "s", 7200, used=True)
    state = AgentState(tmp_path / "s")
    fresh = state.pair(token)[0]
    assert state.caller(fresh) and sum(state.caller(c) is not None for c in creds) == MAX_CREDENTIALS - 1


def test_a_never_used_credential_makes_room_after_its_grace_and_before_any_used_one(tmp_path):
    state = AgentState(tmp_path / "s")
    token = state.new_pairing_token
    creds = [state.pair(token)[0] for _ in range(MAX_CREDENTIALS)]
    _age(tmp_path / "s", NEW_GRACE_S + 1, used=False)
    state = AgentState(tmp_path / "s")
    for c in creds[1:]:
        assert state.caller(c)  # used now: in use
    state.pair(token)
    assert state.caller(creds[0]) is None and all(state.caller(c) for c in creds[1:])


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
