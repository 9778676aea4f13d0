"""The HTTP side: the transport, the routes, and exporter-toolkit's web config (TLS, auth)."""
