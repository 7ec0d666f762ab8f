"""What ``kiln services`` shows and waits for of a canary (kiln.domain.traffic_split): its share, what each version
answered, and ``update --canary --wait``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from kiln.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, fail, info
from kiln.cli.output import plural
from kiln.domain.rollout import RolloutPolicy
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
    text = f"{service.model_name}@{canary.model_version}: {canary.weight}% of predicts, {replicas}"
    policy = canary.policy
    if policy is not None:
        bounds = [f"errors <= {policy.max_error_rate:.1%}"] if policy.max_error_rate is not None else []
        bounds += [f"p99 <= {policy.max_p99_ms:g} ms"] if policy.max_p99_ms is not None else []
        steps = "→".join(f"{x}%" for x in policy.steps)
        text += f"; rollout: {', '.join(bounds) or 'no bounds'} after {policy.min_requests} predicts"
        text += f", steps {steps} every {policy.step_wait:g}s" if steps else ""
    return text


def rollout_policy(
    max_error_rate: float | None,
    max_p99: float | None,
    min_requests: int | None,
    steps: str | None,
    step_wait: float | None,
) -> RolloutPolicy | None:
    """The options' rollout policy; None when no option names one."""
    if (max_error_rate, max_p99, min_requests, steps, step_wait) == (None,) * 5:
        return None
    fields: dict[str, object] = {"max_error_rate": max_error_rate, "max_p99_ms": max_p99}
    if min_requests is not None:
        fields["min_requests"] = min_requests
    if step_wait is not None:
        fields["step_wait"] = step_wait
    if steps is not None:
        try:
            fields["steps"] = [int(x) for x in steps.split(",") if x.strip()]
        except ValueError:
            fail(f"--steps: percentages separated by commas, such as 10,50,100 (not {steps!r})", EXIT_USAGE)
    try:
        return RolloutPolicy.model_validate(fields)
    except ValueError as exc:
        fail(f"rollout policy: {exc}", EXIT_USAGE)


def traffic_text(service: ServiceRead) -> str | None:
    """Per version, what this server forwarded:
    ``@3 stable 900 requests (2.1/s), 1 error (0.1%), p50 4.2 ms, p99 9.8 ms``."""
    parts = []
    for v in service.versions:
        if not v.requests:
            continue
        text = f"@{v.model_version} {v.role} {plural(v.requests, 'request')} ({v.requests_per_second:g}/s)"
        text += f", {plural(v.errors, 'error')} ({v.error_rate or 0:.1%})"
        if v.latency_ms_p50 is not None and v.latency_ms_p99 is not None:
            text += f", p50 {v.latency_ms_p50:.1f} ms, p99 {v.latency_ms_p99:.1f} ms"
        parts.append(text)
    return "; ".join(parts) or None


def shadow_text(service: ServiceRead) -> str | None:
    """``digits@4: 900 copies (3 dropped, 0 errors), 97.0% agree, mean |diff| 0.012, p50 4.1 ms, p99 9.0 ms``."""
    shadow = service.shadow
    if shadow is None:
        return None
    text = f"{service.model_name}@{shadow.model_version}: {shadow.copied} {'copy' if shadow.copied == 1 else 'copies'}"
    text += f" ({shadow.dropped} dropped, {plural(shadow.errors, 'error')})"
    if shadow.agreement_rate is not None:
        text += f", {shadow.agreement_rate:.1%} agree"
    if shadow.mean_abs_diff is not None:
        text += f", mean |diff| {shadow.mean_abs_diff:.4g}"
    if shadow.latency_ms_p50 is not None and shadow.latency_ms_p99 is not None:
        text += f", p50 {shadow.latency_ms_p50:.1f} ms, p99 {shadow.latency_ms_p99:.1f} ms"
    return text


def events_text(service: ServiceRead) -> str | None:
    """The canary's last moves: ``@3 rolled_back by policy at 10%: error rate …``, newest last (three)."""
    lines = [
        f"@{e.version} {e.move.replace('_', ' ')} by {e.by} at {e.weight}%: {e.message}"
        for e in service.rollout_events[-3:]
    ]
    return "\n".join(lines) or None


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
