"""One request's state on a stage (owned by the stage's MLX thread)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine.stage.rewind import Rewind, Rollback
from orchestrator.engine.stage.sampling import Sampler


@dataclass
class RequestState:
    """One request's state on this stage."""

    cache: list[Any]
    sampler: Sampler | None = None
    position: int = 0
    draft: list[int] | None = None  # the drafted tokens its next FORWARD chunk ends with (speculate.py)
    rewind: Rewind = field(init=False)  # how its caches go back after a verification chunk (rewind.py)
    rollback: Rollback | None = Rollback("trim")  # the stage's (rewind.rollback_for); None: it refuses speculation

    def __post_init__(self) -> None:
        self.rewind = Rewind(self.rollback)


__all__ = ["RequestState"]
