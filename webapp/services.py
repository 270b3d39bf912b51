"""Access to the app's services and the viewer's context from a request."""

from __future__ import annotations

from flask import current_app

from webapp import auth
from webapp.views.context import ViewContext


def current_services():
    """The Services of the running app."""
    return current_app.extensions["pipeserve"]


def view_context() -> ViewContext:
    """The current viewer, for view models."""
    return ViewContext(role=auth.role() or "viewer", csrf=auth.csrf_token(), router_url=current_services().router_url)
