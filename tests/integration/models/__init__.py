"""The model registry and serving."""
