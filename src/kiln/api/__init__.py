"""The HTTP API (FastAPI): thin routes over the use cases (kiln.usecases)."""
