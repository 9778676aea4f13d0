"""The HTTP(S) server, as the daemon and tests use it: the app (routes) on the transport.

``exporter.web.app`` answers requests, ``exporter.web.transport`` serves them, and
``exporter.web.config`` reads the web config (TLS, basic auth, headers, rate limit).
"""

from __future__ import annotations

from exporter.web.app import DEFAULT_PAGE_CSP, HANDLER_THREADS, WebRoutes
from exporter.web.transport import WebLimits, WebServer

__all__ = ["DEFAULT_PAGE_CSP", "HANDLER_THREADS", "WebLimits", "WebRoutes", "WebServer"]
