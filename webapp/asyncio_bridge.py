"""asyncio inside the gevent worker: one running loop per greenlet, not per OS thread.

Under gevent every "thread" of the dashboard is a greenlet of one OS thread, but asyncio
keeps "the running loop" per OS thread. zeroconf (LAN discovery) runs its own asyncio loop
in a thread of its own and refuses its synchronous API (`ServiceInfo.request`) when called
"from the loop's thread": under gevent every greenlet looks like that thread, so discovery
failed with "Use AsyncServiceInfo.async_request from the event loop". Rebinding asyncio's
Python-level running-loop functions to greenlet-local storage restores the per-thread
meaning. The C-level slot is still set too, for C helpers (current_task) called in the
loop's own greenlet; the dashboard runs a single asyncio loop (zeroconf's), so it never
holds the wrong one.
"""

from __future__ import annotations


def isolate_asyncio_per_greenlet() -> bool:
    """Make asyncio's running loop greenlet-local; True when done (only under gevent's patching)."""
    try:
        import gevent.local
        import gevent.monkey
    except ImportError:
        return False
    if not gevent.monkey.is_module_patched("threading"):
        return False
    import asyncio
    from asyncio import events

    class _PerGreenlet(gevent.local.local):
        loop_pid = (None, None)

    c_set = getattr(events, "_c__set_running_loop", None)

    def _set_running_loop(loop):  # type: ignore[no-untyped-def]
        events._py__set_running_loop(loop)  # writes the greenlet-local slot below
        if c_set is not None:
            c_set(loop)

    events._running_loop = _PerGreenlet()
    for module in (events, asyncio):
        module._get_running_loop = events._py__get_running_loop
        module._set_running_loop = _set_running_loop
        module.get_running_loop = events._py_get_running_loop
        module.get_event_loop = events._py_get_event_loop
    return True
