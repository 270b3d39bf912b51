"""What a view model may know about the viewer (never the request itself: views stay pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViewContext:
    """The viewer's role and CSRF token, the router URL for links, and which dashboard process
    renders (`boot`, part of each component's revision)."""

    role: str = "viewer"
    csrf: str = ""
    router_url: str = ""
    boot: str = ""

    @property
    def admin(self) -> bool:
        """Whether the viewer may act."""
        return self.role == "admin"
