"""The answering half of the coordinator's scheduler: what the stages send back, and a request's end.

The scheduler thread (`pipeline.Pipeline`) owns this state with everything else. RESULT frames become
each request's token events (a verification pass's RUN of them one token each), ERROR frames end the
request they name (or start it again without a prompt-cache entry a stage could not use), PONG frames
update the stage's figures; a finished request's CLOSE tells the stages where it ended (a stage past it
rolls back) and, with the prompt cache on, which entry its caches become.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engine.coordinator.disk_adoption import DiskAdoption
from orchestrator.engine.coordinator.generation import Failed, Finished, Generation, TokenEvent
from orchestrator.engine.coordinator.links import StageLink, now
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.prefix_index import PrefixIndex
from orchestrator.engine.coordinator.watchdog import Watchdog
from orchestrator.engine.stage.sampling import decode_result
from orchestrator.engine.wire import Flag, Frame, FrameError, Kind, json_frame
from orchestrator.logs import EventLogger

if TYPE_CHECKING:
    from orchestrator.engine.coordinator.draft_model import DraftModel
    from orchestrator.engine.coordinator.pipeline import _Active


class Answering:
    """Mixin of `pipeline.Pipeline`: the stages' answers to requests' events (the request half supplies
    `_admit`, `_dispatch`, `_emit` and `_send`; the liveness half `_probe_token`, `_probe_passed` and
    `_set_state`)."""

    links: list[StageLink]
    log: EventLogger
    metrics: Metrics
    watchdog: Watchdog
    cache: PrefixIndex
    trace: Any
    eos_ids: set[int]
    context_length: int
    drafter: "DraftModel | None"
    _active: dict[int, "_Active"]
    _ready: list[int]
    _group_of: dict[int, int]
    _group_left: dict[int, int]
    _passes: dict[int, list[int]]
    _last_seen: dict[int, float]
    _stats: dict[int, dict]
    _state: str
    _disk: bool
    _adoption: DiskAdoption

    def _on_frames(self, index: int, frames: list[Frame]) -> None:
        self._last_seen[index] = now()
        if self.trace is not None and frames[0].kind is Kind.RESULT:
            self.trace.mark("results")
        for f in frames:
            if f.kind is Kind.RESULT:
                self._on_result(f)
            elif f.kind is Kind.PONG:
                try:
                    self._stats[index] = f.json()
                    self.metrics.observe_stage(self.links[index].node_id, self._stats[index])
                    self.watchdog.observe(index, self._stats[index].get("progress") or {}, now())
                except (FrameError, AttributeError, TypeError, ValueError):
                    pass
            elif f.kind is Kind.ERROR:
                self._on_error(index, f)
            elif f.kind is Kind.CACHE:
                self._on_cache_ack(index, f)
        self._dispatch()

    def _group_done(self, rid: int) -> None:
        gid = self._group_of.pop(rid, None)
        if gid is not None:
            self._group_left[gid] -= 1
            if self._group_left[gid] == 0:
                del self._group_left[gid]

    def _on_result(self, f: Frame) -> None:
        last = not f.flags & Flag.RUN  # a verification pass sends its tokens as a RUN of RESULTs
        passing = self._passes.get(f.request_id)
        if passing is not None:
            passing[1] += 1
        if last:
            self._group_done(f.request_id)
            self._end_pass(f.request_id)
        a = self._active.get(f.request_id)
        if a is None:
            return
        try:
            token, logprob, top = decode_result(f.payload)
        except ValueError as exc:
            self._finish(a, Failed(f"bad result from the last stage: {exc}", 502))
            return
        a.position = f.position
        if a.cancelled:
            self._finish(a, None)
            return
        a.generated += 1
        if a.tokens is not None:
            a.tokens.append(token)
        if a.lookup is not None:
            a.lookup.extend([token])
        if a.generated == 1 and a.internal and not a.canary:
            wrong = self._probe_token(token)
            if wrong:
                self._finish(a, Failed(wrong))
                return
        if a.generated == 1 and not a.internal:
            self.metrics.observe_ttft(now() - a.gen.submitted)
        self._emit(a.gen, TokenEvent(token, logprob, tuple(top)))
        if not a.internal:
            self.metrics.add_tokens(1)
        if a.internal and a.generated >= a.gen.params.max_tokens:
            self._finish(a, Finished("length"))
            if not any(x.internal for x in self._active.values()) and self._state == "warming":
                self._probe_passed()
                self._set_state("ready", "all stages served the probe: prefill, sampling and batched decode")
                if self._disk:
                    self._adoption = DiskAdoption(len(self.links), self.cache.budget)
                    self._send(0, [json_frame(Kind.CACHE, {"disk": "list"})])
        elif token in self.eos_ids and not a.internal:
            self._finish(a, Finished("stop"))
        elif not a.internal and (a.generated >= a.gen.params.max_tokens or a.position >= self.context_length):
            self._finish(a, Finished("length"))
        else:
            a.next_token = token
            if last:
                self._ready.append(a.rid)

    def _on_error(self, index: int, f: Frame) -> None:
        try:
            message = str(f.json().get("message", "stage error"))
        except (FrameError, AttributeError):
            message = "stage error"
        a = self._active.get(f.request_id)
        self.log.warning("request.stage_error", stage=self.links[index].node_id, request=f.request_id, reason=message)
        if a is None:
            return
        self._group_done(a.rid)
        if a.reuse is not None and "prompt cache" in message:
            # A stage could not start it from the entry the index named: forget that entry and
            # start the request again without it (it has produced nothing yet).
            self._drop_entries([a.reuse.entry])
            if a.generated == 0 and not a.cancelled:
                self._finish(a, None, save=False)
                self._admit(a.gen, internal=a.internal, canary=a.canary)
                return
        self._finish(a, Failed(f"{self.links[index].node_id}: {message}", 500))

    def _cancel(self, gen: Generation) -> None:
        rid = getattr(gen, "rid", None)
        a = self._active.get(rid) if rid is not None else None
        if a is None:
            return
        if rid in self._ready:
            self._ready.remove(rid)
            self._finish(a, None)
        else:
            a.cancelled = True  # finished when its in-flight step returns

    def _finish(self, a: _Active, event: Finished | Failed | None, save: bool = True) -> None:
        self._active.pop(a.rid, None)
        if self.drafter is not None:
            self.drafter.forget(a.rid)
        if event is not None:
            self._emit(a.gen, event)
        if a.canary:
            self.watchdog.canary_returned()
        if a.internal and isinstance(event, Failed):
            what = "canary" if a.canary else "probe generation"
            self._set_state("unhealthy", f"{what} failed: {event.message}")
        close = Frame(Kind.CLOSE, a.rid, a.position)  # where it ended: a stage past it rolls back (speculation)
        if save and not a.internal and not isinstance(event, Failed) and self.cache.enabled and a.position > 1:
            # The stages keep its cache (prompt and generated tokens, all but the last sampled) as an entry.
            covered = (list(a.gen.prompt) + (a.tokens or []))[:a.position]
            close = json_frame(Kind.CLOSE, {"save": self.cache.add(covered, "assistant", a.gen.scope),
                                            **self._disk_part(covered, "assistant", a.gen.scope)}, request_id=a.rid,
                               position=a.position)
        self._send(0, [close])
        self.metrics.set_in_flight(self._public_count())

    def _public_count(self) -> int:
        return sum(1 for a in self._active.values() if not a.internal)
