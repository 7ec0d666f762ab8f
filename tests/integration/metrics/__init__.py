"""Metrics and logs: ingest, limits, the store, readers, and across servers."""
