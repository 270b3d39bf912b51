"""The settings module: one parser, default and failure rule per environment variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.engine.coordinator import watchdog
from orchestrator.httpkit.server import Limits

ROOT = Path(__file__).resolve().parent.parent


def test_unset_or_empty_means_the_default() -> None:
    assert settings.CANARY_INTERVAL_S.read({}) == 5.0
    assert settings.CANARY_INTERVAL_S.read({"PIPESERVE_CANARY_INTERVAL_S": "  "}) == 5.0
    assert settings.BLAS.read({}) == "openblas"
    assert settings.STALL_TIMEOUT_S.read({}) is None


def test_a_good_value_is_parsed() -> None:
    assert settings.CANARY_INTERVAL_S.read({"PIPESERVE_CANARY_INTERVAL_S": "600"}) == 600.0
    assert settings.STAGE_THREADS.read({"PIPESERVE_STAGE_THREADS": "2"}) == 2
    assert settings.BLAS.read({"PIPESERVE_BLAS": "reference"}) == "reference"
    assert settings.CACHE.read({"PIPESERVE_CACHE": "/tmp/x"}) == Path("/tmp/x")


@pytest.mark.parametrize("setting, value", [
    (settings.CANARY_INTERVAL_S, "soon"), (settings.CANARY_INTERVAL_S, "0"), (settings.STALL_TIMEOUT_S, "-1"),
    (settings.STALL_TIMEOUT_S, "inf"), (settings.STAGE_THREADS, "two"), (settings.STAGE_THREADS, "-1"),
    (settings.BLAS, "mkl"), (settings.HTTP_MAX_CONNECTIONS, "0"), (settings.PARENT_PID, "x"),
])
def test_a_bad_value_is_an_error_naming_the_variable(setting: settings.Setting, value: str) -> None:
    with pytest.raises(settings.SettingError, match=setting.name):
        setting.read({setting.name: value})


def test_the_readers_use_the_settings() -> None:
    env = {"PIPESERVE_HTTP_IDLE_TIMEOUT": "7", "PIPESERVE_HTTP_MAX_CONNECTIONS": "9"}
    limits = Limits().with_env(env)
    assert (limits.idle_timeout, limits.max_connections, limits.header_timeout) == (7.0, 9, 10.0)
    with pytest.raises(ValueError, match="PIPESERVE_HTTP_BODY_TIMEOUT"):
        Limits().with_env({"PIPESERVE_HTTP_BODY_TIMEOUT": "slow"})


def test_a_bad_stall_timeout_is_no_longer_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPESERVE_STALL_TIMEOUT_S", "3")
    assert watchdog.stall_timeout(20.0) == 3.0
    monkeypatch.setenv("PIPESERVE_STALL_TIMEOUT_S", "fast")
    with pytest.raises(settings.SettingError):
        watchdog.stall_timeout(20.0)


@pytest.mark.parametrize("argv", [["-m", "orchestrator.cli", "--help"], ["-m", "orchestrator.cli", "stage", "--help"]])
def test_an_entry_point_exits_2_naming_the_bad_variable(argv: list[str]) -> None:
    env = {**settings.process_environment(), "PIPESERVE_STAGE_THREADS": "many"}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "PIPESERVE_STAGE_THREADS='many'" in done.stderr and "Traceback" not in done.stderr
    env["PIPESERVE_STAGE_THREADS"] = "1"
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_only_the_settings_module_touches_the_environment() -> None:
    """Every reader goes through orchestrator/settings.py; child environments start from its copy."""
    readers = [p.relative_to(ROOT).as_posix() for folder in ("orchestrator", "webapp")
               for p in sorted((ROOT / folder).rglob("*.py")) if "os.environ" in p.read_text()]
    assert readers == ["orchestrator/settings.py"]
    assert "getenv(" not in "".join(p.read_text() for p in (ROOT / "orchestrator").rglob("*.py"))


def test_every_setting_has_a_doc_and_a_unique_name() -> None:
    names = [s.name for s in settings.ALL]
    assert len(names) == len(set(names))
    assert all(s.doc and s.parse for s in settings.ALL)
