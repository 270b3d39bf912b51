"""A stage's control frames: OPEN, DRAFT, CLOSE, CACHE, RESET and ROUTE (the MLX thread's, like its steps).

An OPEN starts a request's state (its sampler on the last stage, its caches fresh or from a prompt-cache
entry); a DRAFT keeps the tokens its next chunk verifies (engine/stage/speculate.py); a CLOSE ends it,
rolling back first when it ended inside an accepted run, and may keep its caches as an entry; CACHE
frames name checkpoints and evictions (engine/stage/prompt_cache.py); a RESET drops every request; a
ROUTE moves the next stage's address. Each returns what travels on down the chain.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from orchestrator.engine.config import NodeSpec
from orchestrator.engine.stage.constraint import Constraints
from orchestrator.engine.stage.faults import Faults
from orchestrator.engine.stage.links import Links
from orchestrator.engine.stage.prompt_cache import CacheMiss, StageCache, json_or_empty
from orchestrator.engine.stage.request import RequestState
from orchestrator.engine.stage.sampling import Sampler
from orchestrator.engine.stage.shard import StageModel
from orchestrator.engine.stage.speculate import parse_draft
from orchestrator.engine.stage_address import next_address
from orchestrator.engine.wire import Frame, FrameError, Kind, json_frame
from orchestrator.logs import EventLogger


class Control:
    """A stage's control frames, for its MLX thread. Built with the stage's parts it reads and writes
    (its requests, prompt cache, constraints, links) and the five things it asks of the stage: drop
    every request, publish its figures, send an ERROR for a request, end a request, and send frames
    to the coordinator."""

    def __init__(self, model: StageModel, index: int, links: Links, faults: Faults, constraints: Constraints,
                 prompt_cache: StageCache, requests: dict[int, RequestState], rollback: Any, log: EventLogger, *,
                 drop_all: Callable[[str], None], publish: Callable[[], None], error: Callable[[int, str], None],
                 end_request: Callable[[int, Exception | str], None],
                 send_coordinator: Callable[[list[Frame]], None]) -> None:
        self.model, self.index, self.links, self.faults, self.log = model, index, links, faults, log
        self.constraints, self.prompt_cache = constraints, prompt_cache
        self.requests, self.rollback = requests, rollback  # the stage's own objects, shared
        self._drop_all, self._publish, self._error = drop_all, publish, error
        self._end_request, self._send_coordinator = end_request, send_coordinator

    @property
    def next_node(self) -> NodeSpec | None:
        """The next stage's node (None on the last stage); ROUTE frames move it."""
        return self.links.next_node

    def handle(self, frame: Frame) -> list[Frame]:
        """OPEN / DRAFT / CLOSE / CACHE / RESET / ROUTE: update state; returns what to pass downstream."""
        if frame.kind is Kind.RESET:
            self._drop_all("reset by coordinator")
            return [frame] if self.next_node else []
        if frame.kind is Kind.ROUTE:
            self._reroute(frame)
            return [frame] if self.next_node else []  # on to the (possibly new) next stage
        if frame.kind is Kind.OPEN:
            try:
                params = frame.json()
                sampler = (Sampler.from_params(params, self.model.info.vocab_size, self.constraints.build)
                           if self.model.last else None)
            except (ValueError, FrameError) as exc:  # from_params turns any junk JSON into ValueError
                self._error(frame.request_id, f"bad sampling parameters: {exc}")
                return []
            try:
                cache, position = self._request_cache(params)
            except CacheMiss as exc:  # passed on: the next stages must not start the request either
                self._error(frame.request_id, f"stage {self.index}: prompt cache: {exc}")
                return []  # the coordinator starts the request again, without this entry
            self.requests[frame.request_id] = RequestState(cache, sampler, position, rollback=self.rollback)
        elif frame.kind is Kind.DRAFT:
            self._draft(frame)
        elif frame.kind is Kind.CLOSE:
            state = self.requests.pop(frame.request_id, None)
            command = json_or_empty(frame)
            if state is not None and state.rewind.floor is not None and frame.position < state.position:
                try:  # it ended inside an accepted run: an entry keeps only what was accepted
                    self.rollback_to(state, frame.position)
                except ValueError:
                    state = None  # a position no rollback allows: keep no entry of it
            if state is not None and state.rewind.pending and "save" in command:
                state.position = state.rewind.settle(state.cache, state.position, self.model.forward)
                mx.eval([c.state for c in state.cache])
            self._cache_command(command, state)
        elif frame.kind is Kind.CACHE:
            self._cache_command(json_or_empty(frame), None)
        else:
            self.log.warning("frame.unexpected", kind=frame.kind.name)
            return []
        self._publish()
        return [frame] if self.next_node else []

    def _draft(self, frame: Frame) -> None:
        """Keep the drafted tokens of a request's next chunk (the last stage verifies them)."""
        state = self.requests.get(frame.request_id)
        if state is None:
            return
        try:
            if state.sampler is not None and state.sampler.constraint is not None:
                raise ValueError("a constrained request cannot speculate")
            if self.rollback is None:
                raise ValueError("this stage cannot roll a verification chunk back")
            state.draft = parse_draft(frame.json(), self.model.info.vocab_size)
        except (ValueError, FrameError) as exc:
            self._end_request(frame.request_id, f"bad draft: {exc}")

    def rollback_to(self, state: RequestState, to: int) -> None:
        """Cut a request's caches back to `to` after a verification chunk (ValueError if not allowed)."""
        state.position = state.rewind.back(state.cache, state.position, to,
                                           skip_trim="spec-skip-trim" in self.faults.kinds)

    def _request_cache(self, params: Any) -> tuple[list[Any], int]:
        """A fresh cache, or a copy of a prompt-cache entry when the OPEN frame names one."""
        spec = params.get("cache") if isinstance(params, dict) else None
        if spec is None:
            return self.model.make_cache(), 0
        return self.prompt_cache.start(spec)

    def _cache_command(self, command: dict, closed: RequestState | None) -> None:
        try:
            for ack in self.prompt_cache.command(command, closed, self.requests):
                self._ack(ack)
        except (TypeError, ValueError, KeyError) as exc:
            self.log.warning("cache.malformed", reason=exc)

    def _ack(self, payload: dict) -> None:
        self._send_coordinator([json_frame(Kind.CACHE, {**payload, "stage": self.index})])

    def _reroute(self, frame: Frame) -> None:
        """Take the next stage's address from a ROUTE frame: it moved to another node (engine/stage_address.py)."""
        try:
            address = next_address(frame, self.index)
        except FrameError as exc:
            self.log.warning("route.malformed", reason=exc)
            return
        if address is not None:
            self.links.reroute(address)
