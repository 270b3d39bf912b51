"""Coordinator metrics in the Prometheus text format.

Written by the scheduler and HTTP threads, read by `/metrics`: a lock guards the few
counters (the one shared-state exception in the engine, kept tiny on purpose).
"""

from __future__ import annotations

import threading

from orchestrator.httpkit.prometheus import exposition, family, one, sample

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
        self._stage_ids = list(stage_ids)
        self._cache: dict = {}
        self._stage_cache: dict[str, dict] = {}
        self._spec = [0, 0, 0]  # verification passes, drafted tokens, accepted drafts
        self._resumes = [0, 0]  # requests resumed after a lost stage, requests that could not be

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

    def resumed(self, ok: bool) -> None:
        """A request held while a stage was replaced went on (`ok`) or failed."""
        with self._lock:
            self._resumes[0 if ok else 1] += 1

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
            if isinstance(stats.get("prompt_cache"), dict):
                self._stage_cache[stage_id] = dict(stats["prompt_cache"])

    def observe_pass(self, drafted: int, accepted: int) -> None:
        """One verification pass of speculative decoding: `accepted` of `drafted` tokens were right."""
        with self._lock:
            self._spec[0] += 1
            self._spec[1] += drafted
            self._spec[2] += accepted

    def speculation(self) -> dict[str, int]:
        """Verification passes, drafted tokens and accepted drafts so far."""
        with self._lock:
            passes, drafted, accepted = self._spec
        return {"passes": passes, "drafted": drafted, "accepted": accepted}

    def observe_cache(self, stats: dict) -> None:
        """The coordinator's prompt-cache index figures (prefix_index.PrefixIndex.stats)."""
        with self._lock:
            self._cache = dict(stats)

    def render(self) -> str:
        """The Prometheus exposition text."""
        with self._lock:
            running, buckets = 0, []
            for bound, n in zip(TTFT_BUCKETS, self._ttft_counts):
                running += n
                buckets.append(({"le": bound}, running))
            total = running + self._ttft_counts[-1]
            ttft = "pipeserve_time_to_first_token_seconds"
            lines = [
                *family("pipeserve_requests_total", "counter", "HTTP requests by endpoint and status.",
                        [({"endpoint": e, "status": s}, n) for (e, s), n in sorted(self._requests.items())]),
                *one("pipeserve_prompt_tokens_total", "counter", "Prompt tokens processed.", self._prompt_tokens),
                *one("pipeserve_generated_tokens_total", "counter", "Tokens generated.", self._tokens),
                *one("pipeserve_requests_in_flight", "gauge", "Requests generating now.", self._in_flight),
                *one("pipeserve_requests_resumed_total", "counter",
                     "Requests in flight when a stage was lost that went on exactly once it was replaced.",
                     self._resumes[0]),
                *one("pipeserve_requests_resume_failed_total", "counter",
                     "Requests in flight when a stage was lost that could not go on (deadline, or inexact).",
                     self._resumes[1]),
                *family(ttft, "histogram", "Time from request to first token.", []),
                *(sample(ttft + "_bucket", n, labels) for labels, n in [*buckets, ({"le": "+Inf"}, total)]),
                sample(ttft + "_sum", f"{self._ttft_sum:.6f}"),
                sample(ttft + "_count", total),
                *family("pipeserve_stage_step_milliseconds", "gauge",
                        "Recent average compute time of one step per stage.",
                        [({"stage": s}, f"{v:.3f}") for s, v in self._stage_ms.items()]),
                *family("pipeserve_stage_resident_bytes", "gauge", "Resident memory per stage process.",
                        [({"stage": s}, v) for s, v in self._stage_rss.items()]),
                *self._cache_lines(),
                *self._spec_lines(),
            ]
        return exposition(lines)

    def _spec_lines(self) -> list[str]:
        """Speculative decoding (lock held): passes, drafts, acceptance; a pass emits accepted + 1 tokens."""
        passes, drafted, accepted = self._spec
        return [
            *one("pipeserve_spec_passes_total", "counter", "Verification passes of speculative decoding.", passes),
            *one("pipeserve_spec_drafted_tokens_total", "counter", "Drafted tokens sent for verification.", drafted),
            *one("pipeserve_spec_accepted_tokens_total", "counter", "Drafted tokens the last stage accepted.",
                 accepted),
            *one("pipeserve_spec_acceptance_rate", "gauge", "Accepted / drafted tokens so far.",
                 f"{accepted / drafted if drafted else 0.0:.4f}"),
            *one("pipeserve_spec_tokens_per_pass", "gauge",
                 "Tokens emitted per verification pass (accepted drafts + 1).",
                 f"{(accepted + passes) / passes if passes else 0.0:.4f}"),
        ]

    def _cache_lines(self) -> list[str]:
        """The prompt cache: the index's counters, and what each stage holds (lock held)."""
        c = self._cache
        bytes_by_stage = list(c.get("bytes", [])) + [0] * len(self._stage_ids)
        return [
            *one("pipeserve_prompt_cache_lookups_total", "counter", "Requests looked up in the prompt cache.",
                 c.get("lookups", 0)),
            *one("pipeserve_prompt_cache_hits_total", "counter", "Requests that started from a cached prefix.",
                 c.get("hits", 0)),
            *one("pipeserve_prompt_cache_tokens_saved_total", "counter",
                 "Prompt tokens not prefilled thanks to the cache.", c.get("tokens_saved", 0)),
            *one("pipeserve_prompt_cache_entries", "gauge", "Prompt-cache entries every stage holds.",
                 c.get("entries", 0)),
            *family("pipeserve_prompt_cache_bytes", "gauge", "Bytes of prompt-cache entries per stage.",
                    [({"stage": s}, bytes_by_stage[i]) for i, s in enumerate(self._stage_ids)]),
            *one("pipeserve_prompt_cache_budget_bytes", "gauge", "Prompt-cache budget per stage.",
                 c.get("budget_bytes", 0)),
        ]
