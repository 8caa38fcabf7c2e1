"""The HTTP API (FastAPI): see api.app; the drop-in proxy is api.proxy."""
