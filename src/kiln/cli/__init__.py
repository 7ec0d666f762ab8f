"""The ``kiln`` command-line interface (Typer + Rich), built on ``kiln.sdk.client.Client`` only."""
