"""Use cases: what a request asks of the platform. Each public method owns one transaction; routes call exactly one
of them. They record intent; the background tasks (kiln.tasks, kiln.scheduler) act on it."""
