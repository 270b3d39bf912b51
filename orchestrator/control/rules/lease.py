"""How long an engine process outlives a silent control plane, and how often it is renewed (pure).

Every engine process runs under a lease its agent enforces: when the control plane stops
renewing it, the agent stops the process. The length is a trade-off:

* **Short** ends orphans soon: a control plane that is gone for good (its machine died, its
  state directory was deleted) leaves stages and coordinators holding memory and ports for
  at most one lease, and a stage moved away from an agent that was unreachable stops there
  within one lease of its agent's return.
* **Long** lets an ordinary restart of the dashboard (an upgrade, a crash restarted by
  systemd) pass without losing a cluster. A restart costs the time since the last renewal,
  gunicorn's graceful stop (its `graceful_timeout` is 10 s; 12 s measured on a busy machine),
  the outage itself and the new process's start until its first renewal (6–8 s measured at a
  load of 20 on 2 cores). With the old 15 s lease even a 5 s outage lost every engine there.

LEASE_S = 60 s, renewed every RENEW_EVERY_S = 5 s, leaves 55 s for the stop, the outage and
the start: an ordinary restart stays inside it on a loaded machine, and an orphan lives at most
a minute. A restart that takes longer is not lost either: the returning control plane
relaunches what is gone under the same plan (docs/recovery.md, "A dashboard restart").
`pipeserve dashboard --lease-s` chooses another length.
"""

from __future__ import annotations

LEASE_S = 60.0
RENEW_EVERY_S = 5.0


def renew_every(lease_s: float) -> float:
    """Seconds between two renewals of a lease of `lease_s`: often (so the time since the last
    renewal eats little of the lease a restart has), and at least three times per lease."""
    return min(RENEW_EVERY_S, lease_s / 3)
