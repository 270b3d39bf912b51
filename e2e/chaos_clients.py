"""The chaos run's load and its invariant checks (e2e/chaos.py drives the faults).

* `solo_answers`: each case (prompt, max_tokens) answered greedily, alone, before any fault.
* `Clients`: K threads streaming mixed cases through the router with the official `openai`
  client; every answer that completes must equal its solo answer.
* `Monitor`: every 0.25 s, (1) no request may wait longer than `stall_bound` without a token
  or an error, (2) the router may not list a backend that cannot serve (its coordinator's
  /health is not ready or does not answer) for more than `list_bound` seconds.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import openai
import requests

# Mixed prompt and output lengths: short questions, a long instruction, a long continuation.
CASES: tuple[tuple[str, int], ...] = (
    ("What is the capital of France?", 8),
    ("Name three primary colours.", 24),
    ("Write a haiku about the sea.", 40),
    ("Explain in detail how a bicycle works, covering the frame, the wheels, the chain, the gears, "
     "the brakes and how the rider balances, and why each part is shaped the way it is. " * 3, 16),
    ("Count from one to twenty in words.", 64),
    ("Tell me a short story about a robot who learns to paint.", 96),
)


def client_for(router_url: str, read_timeout: float = 120.0) -> openai.OpenAI:
    """An openai client on the router: no retries of its own (the run counts every error)."""
    return openai.OpenAI(base_url=router_url + "/v1", api_key="unused", max_retries=0, timeout=read_timeout)


def stream_answer(client: openai.OpenAI, model: str, case: tuple[str, int], on_token=None) -> str:
    """One greedy streamed chat completion; returns its text (raises openai.APIError on errors)."""
    prompt, max_tokens = case
    text = []
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    for chunk in stream:
        if on_token is not None:
            on_token()
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    return "".join(text)


def solo_answers(router_url: str, model: str, cases: int = len(CASES), attempts: int = 30) -> dict[int, str]:
    """The first `cases` cases' greedy answers, one request at a time (retried while warming up)."""
    client = client_for(router_url)
    out: dict[int, str] = {}
    for i, case in enumerate(CASES[:cases]):
        for attempt in range(attempts):
            try:
                out[i] = stream_answer(client, model, case)
                break
            except openai.APIError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
    return out


@dataclass
class Tally:
    """What the clients saw (guarded by Clients.lock)."""

    completed: int = 0
    matched: int = 0
    mismatches: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # "503", "stream error", "connection" ...
    tokens: int = 0


class Clients:
    """K client threads streaming random cases until stopped."""

    def __init__(self, router_url: str, model: str, solo: dict[int, str], k: int, seed: int) -> None:
        self.router_url, self.model, self.solo, self.k = router_url, model, solo, k
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.tally = Tally()
        self.waiting: dict[int, float] = {}  # client -> monotonic time of its request's last sign of life
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Clients":
        for c in range(self.k):
            t = threading.Thread(target=self._loop, args=(c, random.Random(self.rng.random())), daemon=True,
                                 name=f"chaos-client-{c}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(150)

    def _alive(self, c: int) -> None:
        with self.lock:
            self.waiting[c] = time.monotonic()
            self.tally.tokens += 1

    def _loop(self, c: int, rng: random.Random) -> None:
        client = client_for(self.router_url)
        while not self._stop.is_set():
            i = rng.choice(sorted(self.solo))
            with self.lock:
                self.waiting[c] = time.monotonic()
            try:
                text = stream_answer(client, self.model, CASES[i], lambda: self._alive(c))
            except openai.APIStatusError as exc:
                self._error(c, str(exc.status_code))
                continue
            except openai.APIConnectionError:
                self._error(c, "connection")
                continue
            except openai.APIError:  # an error event inside the stream (the pipeline lost a stage)
                self._error(c, "stream error")
                continue
            with self.lock:
                self.waiting.pop(c, None)
                self.tally.completed += 1
                if text == self.solo[i]:
                    self.tally.matched += 1
                else:
                    self.tally.mismatches.append(f"case {i}: {text[:60]!r} != solo {self.solo[i][:60]!r}")

    def _error(self, c: int, kind: str) -> None:
        with self.lock:
            self.waiting.pop(c, None)
            self.tally.errors[kind] = self.tally.errors.get(kind, 0) + 1
        self._stop.wait(0.5)  # as a client honouring Retry-After would


class Monitor:
    """Checks the clients' waits and the router's listing while the run goes on."""

    def __init__(self, clients: Clients, router_url: str, stall_bound: float, list_bound: float = 2.0) -> None:
        self.clients, self.router_url = clients, router_url
        self.stall_bound, self.list_bound = stall_bound, list_bound
        self.violations: list[str] = []
        self.longest_wait = 0.0
        self.longest_bad_listing = 0.0
        self._flagged: set[tuple[int, float]] = set()
        self._bad_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="chaos-monitor")
        self.t0 = time.monotonic()

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._check_waits()
            self._check_router()

    def _check_waits(self) -> None:
        now = time.monotonic()
        with self.clients.lock:
            waiting = dict(self.clients.waiting)
        for c, since in waiting.items():
            self.longest_wait = max(self.longest_wait, now - since)
            if now - since > self.stall_bound and (c, since) not in self._flagged:
                self._flagged.add((c, since))
                self.violations.append(f"t={now - self.t0:.1f}s client {c} waited {now - since:.1f} s "
                                       "without a token or an error")

    def _check_router(self) -> None:
        try:
            backends = requests.get(self.router_url + "/health", timeout=2).json().get("backends", [])
        except (requests.RequestException, ValueError):
            return
        now = time.monotonic()
        listed = {b["name"]: b["url"] for b in backends if b.get("routable")}
        for name in list(self._bad_since):
            if name not in listed:
                del self._bad_since[name]
        for name, url in listed.items():
            if _serves(url):
                self._bad_since.pop(name, None)
                continue
            since = self._bad_since.setdefault(name, now)
            self.longest_bad_listing = max(self.longest_bad_listing, now - since)
            if now - since > self.list_bound and (hash(name), since) not in self._flagged:
                self._flagged.add((hash(name), since))
                self.violations.append(f"t={now - self.t0:.1f}s the router listed {name} for "
                                       f"{now - since:.1f} s while it could not serve")


def _serves(url: str) -> bool:
    """The backend's coordinator says ready (url is the registered one, ending in /v1)."""
    root = url[:-3] if url.endswith("/v1") else url
    try:
        r = requests.get(root + "/health", timeout=1.0)
        return r.status_code == 200 and bool(r.json().get("ready"))
    except (requests.RequestException, ValueError):
        return False
