"""Kiln: a self-hosted cloud deep-learning platform.

``kiln.Client`` is the Python SDK; ``kiln.log(metrics, step=None)`` and ``kiln.flush()`` record metrics from
inside a job, and ``kiln.should_prune()`` asks a tuning study's pruner from inside a trial (standard library
only). All are imported lazily so that ``import kiln`` stays cheap inside jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from kiln.injob.metrics_sdk import flush, log, should_prune
    from kiln.sdk.client import Client


def __getattr__(name: str) -> Any:
    if name == "Client":
        from kiln.sdk.client import Client

        return Client
    if name in ("log", "flush", "should_prune"):
        from kiln.injob import metrics_sdk

        return getattr(metrics_sdk, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


__all__ = ["Client", "__version__", "flush", "log", "should_prune"]
