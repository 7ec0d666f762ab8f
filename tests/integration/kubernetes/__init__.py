"""The Kubernetes backend against a fake API server (no cluster can run here)."""
