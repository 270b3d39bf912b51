"""Zeroconf on the loopback interface: two real agents are found, and forgotten when they leave."""

from __future__ import annotations

import signal
import time

from orchestrator.agent.discovery import NodeBrowser
from orchestrator.proc import wait_until
from tests.agent.conftest import copy_model


def test_browser_finds_both_agents_and_forgets_them_on_goodbye_and_on_ttl(spawn_agent, test_model_dir):
    events: list[tuple[str, str]] = []
    # A short record TTL so that a killed agent (no goodbye) is forgotten within seconds.
    a = spawn_agent("alpha", "--advertise-ttl", "2", advertise=True, wait=False)
    b = spawn_agent("beta", "--advertise-ttl", "2", advertise=True, wait=False)
    copy_model(test_model_dir, a.models_dir, "tm")
    a.wait_ready()
    b.wait_ready()
    fa, fb = a.client.identity().fingerprint, b.client.identity().fingerprint
    with NodeBrowser(interfaces=["127.0.0.1"], refresh_s=0.5, resolve_timeout_s=1.0,
                     on_change=lambda event, node: events.append((event, node.fingerprint))) as browser:
        # Keyed by fingerprint: agents of other test runs on this machine may be advertising too.
        seen = lambda: {n.fingerprint for n in browser.nodes()}  # noqa: E731
        wait_until(lambda: seen() >= {fa, fb}, 20, message="both agents discovered")
        found = {n.fingerprint: n for n in browser.nodes()}
        alpha, beta = found[fa], found[fb]
        assert (alpha.name, beta.name) == ("alpha", "beta")
        assert alpha.port == a.port and alpha.address == "127.0.0.1" and alpha.url == a.url
        assert alpha.accelerator == a.client.report().accelerator.family and alpha.version == "0.1.0"
        assert alpha.models == ["tm"] and beta.models == []
        time.sleep(3)  # longer than the TTL: live agents answer the re-resolution and stay listed
        assert seen() >= {fa, fb} and not [e for e in events if e[0] == "removed" and e[1] in (fa, fb)]

        b.stop(signal.SIGTERM)  # graceful: a goodbye packet
        wait_until(lambda: fb not in seen(), 10, message="beta forgotten after its goodbye")
        a.stop(signal.SIGKILL)  # a crash: no goodbye, only the TTL
        wait_until(lambda: fa not in seen(), 20, message="alpha forgotten after its records expired")
        assert {("removed", fa), ("removed", fb), ("added", fa), ("added", fb)} <= set(events)
