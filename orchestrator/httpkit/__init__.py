"""pipeserve's one HTTP toolkit: coordinator, router and node agent are all served by it.

A threaded standard-library server with bounded connections, header/idle/body timeouts
and a sized backlog (`server`), a route table with bounded body reading and JSON parsing
(`handler`), one error type mapped to responses in one place (`errors`), server-sent
events (`sse`), and asking an upstream on a client's behalf while watching that client
(`upstream`). No web framework: the engine and the agent must not depend on one.
"""

from orchestrator.httpkit.errors import AnthropicError, OpenAIError, as_anthropic, overloaded
from orchestrator.httpkit.handler import CONTROL_HEADER, App, Handler, Route, route
from orchestrator.httpkit.request import Raw, Request, Streamed, parse_json, validate
from orchestrator.httpkit.server import Limits, Server
from orchestrator.httpkit.sse import EventStream

__all__ = ["CONTROL_HEADER", "AnthropicError", "App", "EventStream", "Handler", "Limits", "OpenAIError", "Raw",
           "Request", "Route", "Server", "Streamed", "as_anthropic", "overloaded", "parse_json", "route", "validate"]
