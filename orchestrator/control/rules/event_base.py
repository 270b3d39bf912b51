"""The base of every event (pure).

Apart from `events.py` so that the event classes of one topic can live in their own module
(`download_events.py`, `timing_events.py`) without an import cycle: each imports this, and
`events` imports them to collect every class. What an event refreshes on the dashboard is the
webapp's to say (webapp/touches.py).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Event(BaseModel):
    """Base of all events. Each concrete class sets `kind` and `persisted`."""

    model_config = ConfigDict(frozen=True)
    kind: str
    persisted: ClassVar[bool]  # save the state after applying it (what must survive a restart)
