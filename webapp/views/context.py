"""What a view model may know about the viewer (never the request itself: views stay pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ViewContext:
    """The viewer's role and CSRF token, plus the router URL for links."""

    role: str = "viewer"
    csrf: str = ""
    router_url: str = ""

    @property
    def admin(self) -> bool:
        """Whether the viewer may act."""
        return self.role == "admin"
