"""Every environment variable pipeserve reads, in one place (docs/configuration.md lists them).

Each `Setting` has a name, a parser, a default and a one-line doc. An unset or empty variable
means the default. A value the parser refuses is one failure everywhere: `SettingError`
naming the variable, and every entry point (`pipeserve ...`, the demo stack, the profiler)
checks all settings first and exits with status 2 (`exit_on_bad_settings`). Only this module
and the builders of a child process's environment touch `os.environ`. Standard library only:
a stage imports it before mlx.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class SettingError(ValueError):
    """An environment variable with a value its parser refuses; the message names it."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: `name`, `parse` (raises ValueError), `default`, `doc`."""

    name: str
    parse: Callable[[str], T]
    default: T
    doc: str
    shown_default: str = ""  # for the docs, where the default is computed ("every core")

    def read(self, env: Mapping[str, str] | None = None) -> T:
        """The parsed value from `env` (default: this process's environment), else the default."""
        raw = (os.environ if env is None else env).get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise SettingError(f"{self.name}={raw[:40]!r}: {exc}") from None

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """True when the variable has a non-empty value."""
        return bool((os.environ if env is None else env).get(self.name, "").strip())


def positive_float(text: str) -> float:
    """A number > 0."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0 (0: off)."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a number >= 0")
    return value


def positive_int(text: str) -> int:
    """A whole number > 0."""
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive whole number")
    return value


def count(text: str) -> int:
    """A whole number >= 0 (0: the library's own choice)."""
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def one_of(*choices: str) -> Callable[[str], str]:
    """A parser accepting exactly one of `choices`."""
    def parse(text: str) -> str:
        if text.strip() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.strip()
    return parse


def text(value: str) -> str:
    """Any non-empty text."""
    return value


def path(value: str) -> Path:
    """A file-system path (~ expanded)."""
    return Path(value.strip()).expanduser()


# --- pipeserve's own ---
CLUSTER_SECRET = Setting("PIPESERVE_CLUSTER_SECRET", text, None,
                         "the cluster's shared secret for an engine process (else the TOML's secret_file)",
                         "none")
BLAS = Setting("PIPESERVE_BLAS", one_of("openblas", "reference"), "openblas",
               "`reference` keeps mlx's own BLAS even where OpenBLAS is installed")
STAGE_THREADS = Setting("PIPESERVE_STAGE_THREADS", count, 0,
                        "BLAS threads of a stage (and the profiler); 0: OpenBLAS's own, every core")
SOLO_THREADS = Setting("PIPESERVE_SOLO_THREADS", count, 0,
                       "BLAS threads for a step with nothing else in flight (stages sharing a host); 0: as above")
STALL_TIMEOUT_S = Setting("PIPESERVE_STALL_TIMEOUT_S", positive_float, None,
                          "seconds without a step before a stage counts as wedged (overrides the cluster's)",
                          "the cluster's, else 15")
CANARY_INTERVAL_S = Setting("PIPESERVE_CANARY_INTERVAL_S", positive_float, 5.0,
                            "idle seconds before the coordinator sends a canary through the pipeline")
RESUME_DEADLINE_S = Setting("PIPESERVE_RESUME_DEADLINE_S", non_negative_float, 60.0,
                            "seconds an answer in flight waits, paused, for a lost stage's replacement before it "
                            "fails (0: it fails at once)")
PREFILL_BATCH = Setting("PIPESERVE_PREFILL_BATCH", one_of("exact", "batched"), "exact",
                        "how the coordinator prefills concurrent requests: `exact` one after another, bit for bit "
                        "mlx-lm's generate_step; `batched` together in one batched step per chunk (within "
                        "float rounding, docs/benchmark.md#batched-prefill)")
PREFILL_CHUNKS = Setting("PIPESERVE_PREFILL_CHUNKS", one_of("mlx", "pipelined"), "mlx",
                         "where a prompt's prefill chunks are cut: `mlx` every prefill_step_size tokens, bit for bit "
                         "mlx-lm's generate_step; `pipelined` into about 4 equal chunks per stage so the stages "
                         "overlap (bit for bit generate_step run with that chunk length as its prefill_step_size; "
                         "docs/benchmark.md#pipelined-prefill)")
PARENT_PID = Setting("PIPESERVE_PARENT_PID", positive_int, None,
                     "set by an agent for its engine processes: they stop when that process is gone", "none")
FAULTS = Setting("PIPESERVE_FAULTS", text, "",
                 "test-only fault hooks of stage processes, e.g. `stage-1:step-error` "
                 "(orchestrator/engine/stage/faults.py)",
                 "none")
HTTP_MAX_CONNECTIONS = Setting("PIPESERVE_HTTP_MAX_CONNECTIONS", positive_int, None,
                               "open connections one HTTP server accepts", "from the open-file limit, 16-1024")
HTTP_HEADER_TIMEOUT = Setting("PIPESERVE_HTTP_HEADER_TIMEOUT", positive_float, None,
                              "seconds a client may take to send a request's headers", "10")
HTTP_IDLE_TIMEOUT = Setting("PIPESERVE_HTTP_IDLE_TIMEOUT", positive_float, None,
                            "seconds a kept-alive connection may stay idle", "30")
HTTP_BODY_TIMEOUT = Setting("PIPESERVE_HTTP_BODY_TIMEOUT", positive_float, None,
                            "seconds a client may take to send a request's body", "60")
HTTP_WRITE_TIMEOUT = Setting("PIPESERVE_HTTP_WRITE_TIMEOUT", positive_float, None,
                             "seconds a response write may block on a slow reader", "120")
LOG_MAX_BYTES = Setting("PIPESERVE_LOG_MAX_BYTES", count, 10 << 20,
                        "a process's log file is rotated to <file>.1 past this many bytes (0: never)", "10485760")
LOG_FILE = Setting("PIPESERVE_LOG_FILE", path, None,
                   "set by a parent for its child process: the file its output goes to (the one it rotates)", "none")
FOLLOW_DEADLINE_S = Setting("PIPESERVE_FOLLOW_DEADLINE_S", positive_float, 24 * 3600.0,
                            "seconds a LAN copy may follow a peer's download before it fails (restarts included)",
                            "86400")
CACHE = Setting("PIPESERVE_CACHE", path, None,
                "where downloads (the demo model's wheel) are kept", "$XDG_CACHE_HOME/pipeserve")
ROUTER_ADMIN_TOKEN = Setting("PIPESERVE_ROUTER_ADMIN_TOKEN", text, None,
                             "the router's admin token the dashboard registers sessions with", "none")

STEP_TRACE = Setting("PIPESERVE_STEP_TRACE", path, None,
                     "a file every stage and coordinator appends its steps' timestamps to, to time a running "
                     "pipeline across its processes (engine/steptrace.py); unset: nothing is recorded", "none")

CHROMIUM = Setting("PIPESERVE_CHROMIUM", text, "/usr/bin/chromium",
                   "the Chromium binary the browser tests drive (e2e/)")
TIMING_TRIES = Setting("PIPESERVE_TIMING_TRIES", positive_int, 3,
                       "timings of a model's layers while the machine looks busy; the last one is shown flagged")
FULL_MATRIX = Setting("PIPESERVE_FULL_MATRIX", one_of("0", "1"), "0",
                      "`1`: the tests check every row of the family matrices (`make test-matrix`); `0`: every "
                      "family and every variant, not every pair (tests/support/matrix.py)")

# --- read from the ordinary environment ---
HF_ENDPOINT = Setting("HF_ENDPOINT", text, None, "the Hugging Face Hub address agents download from",
                      "huggingface_hub's own")
XDG_STATE_HOME = Setting("XDG_STATE_HOME", path, None, "base of an agent's default state directory",
                         "~/.local/state")
XDG_CACHE_HOME = Setting("XDG_CACHE_HOME", path, None, "base of the default download cache", "~/.cache")

ALL: tuple[Setting, ...] = (
    CLUSTER_SECRET, BLAS, STAGE_THREADS, SOLO_THREADS, STALL_TIMEOUT_S, CANARY_INTERVAL_S, RESUME_DEADLINE_S,
    PREFILL_BATCH, PREFILL_CHUNKS, PARENT_PID, FAULTS,
    HTTP_MAX_CONNECTIONS, HTTP_HEADER_TIMEOUT, HTTP_IDLE_TIMEOUT, HTTP_BODY_TIMEOUT, HTTP_WRITE_TIMEOUT,
    LOG_MAX_BYTES, LOG_FILE, FOLLOW_DEADLINE_S, CACHE, ROUTER_ADMIN_TOKEN, STEP_TRACE, TIMING_TRIES, CHROMIUM,
    FULL_MATRIX,
    HF_ENDPOINT, XDG_STATE_HOME, XDG_CACHE_HOME,
)


def check(env: Mapping[str, str] | None = None) -> None:
    """Parse every setting; raises SettingError naming the first bad one."""
    for setting in ALL:
        setting.read(env)


def exit_on_bad_settings(env: Mapping[str, str] | None = None, program: str = "pipeserve") -> None:
    """The one failure rule: a bad value ends the program at its start with status 2, naming the variable."""
    try:
        check(env)
    except SettingError as exc:
        print(f"{program}: bad setting: {exc} (see docs/configuration.md)", file=sys.stderr)
        raise SystemExit(2) from None


def process_environment() -> dict[str, str]:
    """A copy of this process's environment, the base of a child process's environment."""
    return dict(os.environ)


def set_for_libraries(name: str, value: str, keep_existing: bool = False) -> None:
    """Set a variable a native library of this process reads when it loads (OpenBLAS's own)."""
    if keep_existing:
        os.environ.setdefault(name, value)
    else:
        os.environ[name] = value
