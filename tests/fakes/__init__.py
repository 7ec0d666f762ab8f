"""Fakes of external services for tests (named so: none of them is the real thing)."""
