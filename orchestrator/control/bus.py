"""The event bus: every applied event, fanned out to every viewer (websockets), never blocking.

The orchestrator thread publishes each event after applying it (`core.Orchestrator`); each
subscriber has its own bounded queue. Shell, not rules: it holds threads' queues and a lock.
"""

from __future__ import annotations

import queue
import threading

from orchestrator.control.rules.event_base import Event


class Subscription(queue.Queue):
    """One subscriber's bounded queue, and whether the bus gave up on it.

    A subscriber that fell `maxsize` events behind is dropped; `dropped` tells it so (its queue
    no longer receives anything), and it must start again from a fresh snapshot of the state.
    """

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.dropped = threading.Event()


class EventBus:
    """Fan-out of applied events to subscribers; each gets its own bounded queue.

    A subscriber that stops reading is dropped rather than allowed to block the orchestrator,
    and its `Subscription.dropped` is set so it can resynchronise instead of going quiet.
    """

    def __init__(self, maxsize: int = 1000) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._maxsize = maxsize

    def subscribe(self) -> Subscription:
        """A new queue that receives every event published from now on."""
        q = Subscription(self._maxsize)
        with self._lock:
            self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue) -> None:
        """Stop delivering to q."""
        with self._lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    def subscribers(self) -> list[Subscription]:
        """The current subscriptions (a copy)."""
        with self._lock:
            return list(self._subscribers)

    def drop(self, q: Subscription) -> None:
        """Give up on a subscriber: stop delivering to it and tell it so."""
        self.unsubscribe(q)
        q.dropped.set()

    def publish(self, event: Event) -> None:
        """Deliver to every subscriber (non-blocking); one that is full is dropped."""
        for q in self.subscribers():
            try:
                q.put_nowait(event)
            except queue.Full:
                self.drop(q)


__all__ = ["EventBus", "Subscription"]
