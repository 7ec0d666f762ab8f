"""The Python SDK: ``kiln.sdk.Client`` speaks the signed REST API; the CLI is built on it."""
