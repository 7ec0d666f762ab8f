"""What ``kiln services`` shows and waits for of a canary (kiln.domain.traffic_split): its share, what each version
answered, and ``update --canary --wait``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from kiln.cli.common import EXIT_INTERRUPTED, fail, info
from kiln.cli.output import plural
from kiln.domain.serving import ReplicaState, ServiceRead

if TYPE_CHECKING:
    from kiln.sdk.client import Client

POLL = 1.0


def canary_text(service: ServiceRead) -> str | None:
    """``digits@3: 10% of predicts, 1 replica``."""
    canary = service.canary
    if canary is None:
        return None
    replicas = plural(canary.replicas, "replica")
    return f"{service.model_name}@{canary.model_version}: {canary.weight}% of predicts, {replicas}"


def traffic_text(service: ServiceRead) -> str | None:
    """Per version, what this server forwarded: ``@3 stable 900 requests, 1 error, 4.2 ms mean``."""
    parts = [
        f"@{v.model_version} {v.role} {plural(v.requests, 'request')}, {plural(v.errors, 'error')}"
        + (f", {v.latency_ms_mean:g} ms mean" if v.latency_ms_mean is not None else "")
        for v in service.versions
        if v.requests
    ]
    return "; ".join(parts) or None


def wait_canary(client: Client, service: ServiceRead, timeout: float, show: Callable[[ServiceRead], None]) -> NoReturn:
    """Until the canary's replicas are ready (exit 0), or one started for it failed (exit 1), or it ended (1)."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            current = client.get_service(service.name)
            canary = current.canary
            if canary is None:
                fail(f"service {service.name} runs no canary any more (promoted or rolled back meanwhile)")
            mine = [r for r in current.replicas if r.canary and r.model_version == canary.model_version]
            failed = [r for r in mine if r.state == ReplicaState.FAILED and r.created_at >= service.updated_at]
            if failed or sum(r.state == ReplicaState.READY for r in mine) >= canary.replicas:
                show(current)
                if failed:
                    fail(f"canary replica {failed[-1].id} failed: {failed[-1].message}")
                info(f"service {current.name}: canary {canary_text(current)}, ready")
                raise typer.Exit(0)
            if time.monotonic() > deadline:
                fail(f"the canary of service {service.name} was not ready after {timeout:g}s")
            time.sleep(POLL)
    except KeyboardInterrupt:
        info(f"\nstopped waiting; service {service.name} goes on (see it with: kiln services show {service.name})")
        raise typer.Exit(EXIT_INTERRUPTED) from None
