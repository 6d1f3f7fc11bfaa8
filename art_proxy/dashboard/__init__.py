"""The trajectory dashboard: `/dashboard` on the proxy, for people watching an agent learn.

Server-rendered pages (Jinja2, autoescape on) with one small script that keeps them live; plots are
inline SVG drawn on the server. Nothing is fetched from elsewhere, so it works offline, and a
Content-Security-Policy allows only the dashboard's own script. Trajectory content is untrusted
input: it reaches a page only as escaped text. `guard.py` decides who may look (the admin key),
`views.py` what they see, `queries.py` reads what the store's own methods do not.
"""

from __future__ import annotations

from .guard import guard_dashboard, is_dashboard_path
from .views import add_routes

__all__ = ["add_routes", "guard_dashboard", "is_dashboard_path"]
