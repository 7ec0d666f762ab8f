"""The local executor: job attempts run as processes on this machine under a per-attempt shim."""
