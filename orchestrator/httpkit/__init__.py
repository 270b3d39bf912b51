"""pipeserve's one HTTP toolkit: coordinator, router and node agent are all served by it.

A threaded standard-library server with bounded connections, header/idle/body timeouts
and a sized backlog (`server`), a route table with bounded body reading and JSON parsing
(`handler`), one error type mapped to responses in one place (`errors`), and server-sent
events (`sse`). No web framework: the engine and the agent must not depend on one.
"""

from .errors import OpenAIError, overloaded
from .handler import App, Handler, Route, route
from .request import Raw, Request, Streamed, parse_json, validate
from .server import Limits, Server
from .sse import EventStream

__all__ = ["App", "EventStream", "Handler", "Limits", "OpenAIError", "Raw", "Request", "Route", "Server",
           "Streamed", "overloaded", "parse_json", "route", "validate"]
