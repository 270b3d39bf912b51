"""Coordinator metrics in the Prometheus text format.

Written by the scheduler and HTTP threads, read by `/metrics`: a lock guards the few
counters (the one shared-state exception in the engine, kept tiny on purpose).
"""

from __future__ import annotations

import threading

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Counters, gauges and a time-to-first-token histogram."""

    def __init__(self, stage_ids: list[str]) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._prompt_tokens = 0
        self._tokens = 0
        self._in_flight = 0
        self._ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self._ttft_sum = 0.0
        self._stage_ms: dict[str, float] = {s: 0.0 for s in stage_ids}
        self._stage_rss: dict[str, int] = {s: 0 for s in stage_ids}

    def count_request(self, endpoint: str, status: int) -> None:
        """One finished HTTP request."""
        with self._lock:
            key = (endpoint, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1

    def add_prompt_tokens(self, n: int) -> None:
        """Prompt tokens accepted."""
        with self._lock:
            self._prompt_tokens += n

    def add_tokens(self, n: int) -> None:
        """Tokens generated."""
        with self._lock:
            self._tokens += n

    def set_in_flight(self, n: int) -> None:
        """Requests currently generating."""
        with self._lock:
            self._in_flight = n

    def observe_ttft(self, seconds: float) -> None:
        """Time from submission to the first token."""
        with self._lock:
            i = next((k for k, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))
            self._ttft_counts[i] += 1
            self._ttft_sum += seconds

    def observe_stage(self, stage_id: str, stats: dict) -> None:
        """Latest per-stage figures from a PONG."""
        with self._lock:
            self._stage_ms[stage_id] = float(stats.get("step_ms", 0.0))
            self._stage_rss[stage_id] = int(stats.get("rss_bytes", 0))

    def render(self) -> str:
        """The Prometheus exposition text."""
        with self._lock:
            lines = [
                "# HELP pipeserve_requests_total HTTP requests by endpoint and status.",
                "# TYPE pipeserve_requests_total counter",
                *(f'pipeserve_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                  for (e, s), n in sorted(self._requests.items())),
                "# HELP pipeserve_prompt_tokens_total Prompt tokens processed.",
                "# TYPE pipeserve_prompt_tokens_total counter",
                f"pipeserve_prompt_tokens_total {self._prompt_tokens}",
                "# HELP pipeserve_generated_tokens_total Tokens generated.",
                "# TYPE pipeserve_generated_tokens_total counter",
                f"pipeserve_generated_tokens_total {self._tokens}",
                "# HELP pipeserve_requests_in_flight Requests generating now.",
                "# TYPE pipeserve_requests_in_flight gauge",
                f"pipeserve_requests_in_flight {self._in_flight}",
                "# HELP pipeserve_time_to_first_token_seconds Time from request to first token.",
                "# TYPE pipeserve_time_to_first_token_seconds histogram",
            ]
            running = 0
            for bound, n in zip(TTFT_BUCKETS, self._ttft_counts):
                running += n
                lines.append(f'pipeserve_time_to_first_token_seconds_bucket{{le="{bound}"}} {running}')
            total = running + self._ttft_counts[-1]
            lines += [
                f'pipeserve_time_to_first_token_seconds_bucket{{le="+Inf"}} {total}',
                f"pipeserve_time_to_first_token_seconds_sum {self._ttft_sum:.6f}",
                f"pipeserve_time_to_first_token_seconds_count {total}",
                "# HELP pipeserve_stage_step_milliseconds Recent average compute time of one step per stage.",
                "# TYPE pipeserve_stage_step_milliseconds gauge",
                *(f'pipeserve_stage_step_milliseconds{{stage="{s}"}} {v:.3f}' for s, v in self._stage_ms.items()),
                "# HELP pipeserve_stage_resident_bytes Resident memory per stage process.",
                "# TYPE pipeserve_stage_resident_bytes gauge",
                *(f'pipeserve_stage_resident_bytes{{stage="{s}"}} {v}' for s, v in self._stage_rss.items()),
            ]
        return "\n".join(lines) + "\n"
