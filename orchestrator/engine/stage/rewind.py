"""How one request's caches on one stage go back after a verification chunk (speculate.py).

A verification chunk runs k+1 positions, of which only the accepted ones stay valid. Plain KV caches
(and MLA, quantized KV) roll back with mlx-lm's own `trim`: an offset moves. The others cannot: a
recurrent state (SSM, linear attention: `ArraysCache`) has folded every position into one array, a
full sliding window (`RotatingKVCache`) has dropped its oldest keys to make room, a chunked-attention
cache (`ChunkedKVCache`) has cut its front. For those the stage keeps a *rewind point* before the chunk —
the caches' fields as they were (references: MLX arrays are values, and a chunk of several positions
replaces a window's or a state's arrays rather than writing into them; a window's arrays as objects of
their own, batch.snapshot's `held`) and the inputs it ran since — and rolls back by putting the fields
back and running the accepted positions again. It runs them in front of the request's next input, as
one forward, so a rollback costs a few more positions in the next step rather than a step of its own;
the output of the replayed positions is dropped.

A verification chunk that follows such a rollback keeps the same rewind point (its replayed positions
and its own are what a further rollback replays), until REPLAY_MAX positions would be replayed: then
the replay runs as a forward of its own first and a fresh point is taken.

A family whose chunk of positions is not its decode steps (support.STEPWISE: PLaMo 3) runs every forward
that stands for decode steps — a verification chunk, a replay and what follows it — as one-position
forwards in a row: it then is those decode steps. Inputs and outputs are cut and joined by position with
the stage's `Rollback.inputs` / `.outputs` (carry.EveryPosition; DeepSeek-V4.1's boundaries also carry
entries per compressed group: hyper_streams.GroupedParts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, RotatingKVCache, can_trim_prompt_cache

from orchestrator.engine.stage.batch import restore, snapshot
from orchestrator.engine.stage.carry import EveryPosition
from orchestrator.engine.stage.prompt_cache import trim_exactly
from orchestrator.families import support

REPLAY_MAX = 32  # positions one forward may replay in front of its own before the replay runs on its own

Forward = Callable[[Any, list[Any]], Any]  # StageModel.forward


def trims(cache: list[Any]) -> bool:
    """Whether a fresh request cache rolls back with `trim` at any length: every layer plain or
    quantized KV (an offset), none with a recurrent state, a window or chunks."""
    def plain(c: Any) -> bool:
        if isinstance(c, CacheList):
            return all(plain(m) for m in c.caches)
        return not isinstance(c, (ArraysCache, RotatingKVCache, ChunkedKVCache))

    return bool(cache) and can_trim_prompt_cache(cache) and all(plain(c) for c in cache)


def rollback_of(cache: list[Any]) -> str:
    """How a fresh request cache of this model goes back after a verification chunk: "trim" or "replay"."""
    return "trim" if trims(cache) else "replay"


@dataclass(frozen=True)
class Rollback:
    """How a stage's requests go back after a verification chunk (the same for all: fixed at start)."""

    how: str  # rollback_of its caches: "trim" or "replay"
    stepwise: bool = False  # forwards that stand for decode steps run one position at a time (support.STEPWISE)
    inputs: Any = field(default_factory=EveryPosition)  # how its inputs are cut and joined by position
    outputs: Any = field(default_factory=EveryPosition)  # ... and its outputs


def rollback_for(model: Any) -> Rollback | None:
    """A stage model's (StageModel) Rollback; None when it refuses speculation. (Profiling's stand-in
    model has no family and cuts nothing but by position.)"""
    if model.speculation_refusal:
        return None
    inputs, outputs = getattr(model, "by_position", (EveryPosition(), EveryPosition()))
    stepwise = support.verifies_stepwise(getattr(model, "family", ""))
    return Rollback(rollback_of(model.make_cache()), stepwise, inputs, outputs)


@dataclass
class RewindPoint:
    """A request's caches as they were at `position`, and what the stage ran for it since."""

    fields: list[Any]
    position: int
    inputs: list[Any]  # each [1, L, ...]: token ids or hidden states


class Rewind:
    """One request's rollback on one stage (its MLX thread): trim, or rewind point and replay."""

    def __init__(self, rollback: Rollback | None) -> None:
        self.rollback = rollback  # None: a stage that refuses speculation
        self.floor: int | None = None  # after a verification chunk: the lowest position it may go back to
        self.point: RewindPoint | None = None
        self.replay: Any = None  # accepted positions waiting to run in front of the next input
        # the forward `prepare` set up: where it starts, the replayed positions it leads with, one at a time?
        self.start, self.drop, self.stepwise = 0, 0, False

    @property
    def trims(self) -> bool:
        """Whether the caches roll back by trimming."""
        return self.rollback is not None and self.rollback.how == "trim"

    @property
    def pending(self) -> int:
        """Positions a rollback left to run again (0 when none)."""
        return 0 if self.replay is None else int(self.replay.shape[1])

    def back(self, cache: list[Any], position: int, to: int, skip_trim: bool = False) -> int:
        """Roll `cache` back from `position` to `to` after a verification chunk; returns the position
        the caches now hold (`to`, or the rewind point's with the rest left to replay). ValueError when
        that is not a rollback the last chunk allows. `skip_trim` (a test fault) only moves the position."""
        if self.floor is None or not self.floor <= to < position:
            raise ValueError(f"KV position {to} != expected {position}")
        self.floor = None
        if skip_trim:
            self.point = None
            return to
        if self.trims:
            trim_exactly(cache, position - to)
            return to
        point = self.point
        if point is None or self.rollback is None:
            raise ValueError("no rewind point for this rollback")
        restore([cache], [point.fields], held=True)
        inputs = self.rollback.inputs
        self.replay = inputs.positions(inputs.join(point.inputs, point.position), point.position, 0,
                                       to - point.position)
        return point.position

    def prepare(self, cache: list[Any], position: int, x: Any, verifying: bool,
                forward: Forward) -> tuple[Any, int]:
        """Before a forward of `x` at `position`: the input to run (the replay in front) and the position
        the forward starts from; `forward` below then runs it. Takes a rewind point for a verification
        chunk on caches that cannot trim."""
        replay, self.replay = self.replay, None
        self.start, self.drop, rollback = position, 0, self.rollback
        self.stepwise = rollback is not None and rollback.stepwise and (verifying or replay is not None)
        if rollback is None or rollback.how != "replay":
            return x, position
        if verifying and replay is not None and int(replay.shape[1]) + int(x.shape[1]) > REPLAY_MAX:
            self._run(forward, replay, cache, position)  # the replay on its own; the new point is taken after it
            position, replay = position + int(replay.shape[1]), None
        self.start = position
        if not verifying:
            self.point = None  # a plain step: no rollback may follow it
        elif replay is None:
            self.point = RewindPoint(snapshot([cache], held=True)[0], position, [x])
        else:
            assert self.point is not None  # a replay comes from a rollback to this point
            self.point.inputs = [replay, x]
        if replay is None:
            return x, position
        self.drop = int(replay.shape[1])
        return rollback.inputs.join([replay, x], position), position

    def forward(self, forward: Forward, x: Any, cache: list[Any]) -> Any:
        """Run the forward `prepare` set up (one position at a time where it stands for decode steps of
        a stepwise family); its output without the replayed positions."""
        h = self._run(forward, x, cache, self.start) if self.stepwise else forward(x, cache)
        return h if self.drop == 0 or self.rollback is None else self.rollback.outputs.positions(h, self.start,
                                                                                                 self.drop)

    def _run(self, forward: Forward, x: Any, cache: list[Any], at: int) -> Any:
        """A forward of `x` from `at` that stands for decode steps (a replay, a verification chunk)."""
        rollback, length = self.rollback, int(x.shape[1])
        if rollback is None or not rollback.stepwise or length == 1:
            return forward(x, cache)
        steps = [forward(rollback.inputs.positions(x, at, i, i + 1), cache) for i in range(length)]
        return rollback.outputs.join(steps, at)

    def ran(self, chunk_position: int, verifying: bool) -> None:
        """After the forward of a chunk that starts at `chunk_position`: a verification chunk may be
        rolled back to just after its first position."""
        self.floor = chunk_position + 1 if verifying else None

    def settle(self, cache: list[Any], position: int, forward: Forward) -> int:
        """Run what a rollback left to replay now (a request that ends: its caches are stored as they
        are); returns the position the caches hold."""
        replay, self.replay, self.point = self.replay, None, None
        if replay is None:
            return position
        self._run(forward, replay, cache, position)
        return position + int(replay.shape[1])


__all__ = ["REPLAY_MAX", "Rewind", "RewindPoint", "Rollback", "rollback_for", "rollback_of", "trims"]
