"""A canary's rollout policy at work, in the ``serving`` task (leased; its writes fenced by ``ctx.transaction()``).

At each pass, for a service whose canary has a policy (kiln.domain.rollout), the canary's and the stable version's
figures since the canary's share last changed — the router's per-version counts and latency histograms now, minus a
snapshot taken when this task first saw that share — are judged by ``decide``: the share advances to the next step,
the canary is promoted at 100 or rolled back when it broke a bound, each move written with a service event and a
notification event (kiln.usecases.models.rollout) in one transaction.

The figures are those of this server's router (the one holding the serving lease) plus what every other live server
published of its own (kiln.tasks.serving_routes: per version, in ``service_traffic``); the window begins again after
a restart or a take-over, or when a server's figures go away (``min_requests`` counted anew), while the wait of a
step counts from ``canary_step_at``, in the database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from kiln.db.tables import Service, utcnow
from kiln.domain.rollout import Decision, RolloutPolicy, VersionStats, decide
from kiln.domain.serving import ServiceState
from kiln.routing.router import Router
from kiln.tasks.runner import TaskContext
from kiln.usecases.models import rollout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Window:
    at: tuple[int, int, datetime | None]  # (canary version, share, when the share was set): the step it counts
    canary: VersionStats
    stable: VersionStats


class Rollouts:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._windows: dict[str, _Window] = {}  # service id → where its current step's figures begin
        self.last: dict[str, Decision] = {}  # service id → the last verdict (what the serving task logs)

    def drive(self, ctx: TaskContext, service: Service, remote: dict[int, VersionStats] | None = None) -> None:
        """``remote``: what the other live servers forwarded per version, as they last published it."""
        if service.canary_version is None or not service.canary_policy or service.state == ServiceState.DELETING:
            self._windows.pop(service.id, None)
            self.last.pop(service.id, None)
            return
        policy = RolloutPolicy.model_validate(service.canary_policy)
        traffic, remote = self.router.version_traffic(service.id), remote or {}
        canary, stable = (
            traffic.get(v, VersionStats()).plus(remote.get(v, VersionStats()))
            for v in (service.canary_version, service.model_version)
        )
        at = (service.canary_version, service.canary_weight, service.canary_step_at)
        window = self._windows.get(service.id)
        if window is None or window.at != at:
            self._windows[service.id] = _Window(at, canary, stable)  # this step's figures begin now
            return
        began = service.canary_step_at or service.updated_at
        waited = (utcnow() - began).total_seconds()
        decision = decide(
            policy, service.canary_weight, canary.minus(window.canary), stable.minus(window.stable), waited
        )
        self.last[service.id] = decision
        if decision.action == "wait":
            return
        with ctx.transaction() as s:
            row = s.get(Service, service.id, with_for_update=True)
            if row is None or (row.canary_version, row.canary_weight, row.canary_step_at) != at:
                return  # changed meanwhile (by hand): judged again from its new step
            if row.state == ServiceState.DELETING:
                return
            if decision.action == "rollback":
                rollout.roll_back(s, row, decision.why, "policy")
            elif decision.action == "promote":
                rollout.promote(s, row, decision.why, "policy")
            else:
                rollout.advance(s, row, decision.weight, decision.why)
        log.info("service %s: canary %s (%s)", service.name, decision.action, decision.why)
        self._windows.pop(service.id, None)
