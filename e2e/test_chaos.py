"""The chaos run's smoke version (e2e/chaos.py; the full run is a script, docs/recovery.md, "Chaos run"):
two streaming clients through the router while a stage is killed and the control plane
restarts; every invariant about behaviour must hold (zero violations). How long a recovery
took is printed, not asserted: measured times belong to the full run and e2e/bench_recovery.py."""

from __future__ import annotations

import time

import pytest

from e2e import chaos


@pytest.mark.slow
def test_chaos_smoke_two_faults_no_invariant_violated(capsys):
    started = time.monotonic()
    code = chaos.main(["--clients", "2", "--cases", "2", "--sequence", "kill-stage,restart-control",
                       "--gap", "0.5", "1", "--hold", "1", "1", "--seed", "7", "--time-targets", "report"])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert "invariant violations: 0" in out and "| 2 | " in out, out
    print(f"chaos smoke took {time.monotonic() - started:.0f} s")
