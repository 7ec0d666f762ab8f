"""Budgets: a monthly limit on what an organisation, or one of its members, spends under the price table.

A budget counts the cost of the calendar month so far (UTC; kiln.usecases.usage.usage prices it). Past its ``soft``
limit every new job of its scope gets a warning event (and the audit a ``budget.soft_limit`` entry once a
month); past its ``hard`` limit a new submission is refused (``BudgetExceeded``, 403, naming the budget, what
was used and when it resets) — every way new work is created checks it (a job, a rerun, a study, a pipeline run,
a service, a notebook). What was admitted before keeps running (a study's next trials, a pipeline's next steps,
a service's replicas) unless the budget says ``stop_running``: then the leased task ``usage`` cancels the
scope's active jobs every pass (and at once when such a budget is set) while the limit stays spent. Each mark
crossed is told once a month to the subscriptions of ``budget.soft_limit`` and ``budget.hard_limit``.

The platform admin sets an organisation's budget; an org admin sets budgets on members of their organisation.
Any member sees the budgets that apply to them (the console's banner).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from kiln.db.session import Database
from kiln.db.tables import Budget, Job, NotificationEvent, Organization, User, utcnow
from kiln.domain.ids import new_id
from kiln.domain.states import TERMINAL_STATES
from kiln.domain.usage import BudgetRead, BudgetSet, format_money
from kiln.errors import BudgetExceeded, Forbidden, InvalidInput, NotFound
from kiln.usecases.access import audit
from kiln.usecases.access.accounts import find_org, find_user
from kiln.usecases.access.identity import Principal
from kiln.usecases.jobs.jobs import request_cancel
from kiln.usecases.notifications import notification_outbox
from kiln.usecases.usage.usage import UsageService

FRESH_SECONDS = 5.0  # a month's cost read for a check is used again this long (it changes by the second)


@dataclass(frozen=True)
class Month:
    name: str  # 2026-12
    start: float
    end: float  # the next month's start: when the count resets

    @classmethod
    def of(cls, now: float) -> Month:
        day = datetime.fromtimestamp(now, UTC)
        start = day.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return cls(start.strftime("%Y-%m"), start.timestamp(), end.timestamp())


class BudgetService:
    def __init__(self, db: Database, usage: UsageService, wake: Callable[[], None] = lambda: None) -> None:
        self.db = db
        self.usage = usage
        self.wake = wake  # runs the task that enforces stop_running now
        self._costs: dict[tuple[str, str, str], tuple[float, float]] = {}  # (org, user, month) → (cost, read at)
        # (org, user) found without a budget of either → when: most have none, and every new job asks (twice)
        self._none: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    # -- setting and reading ------------------------------------------------------------------------------

    def set(self, principal: Principal, body: BudgetSet) -> BudgetRead:
        """Create or replace the budget of an organisation (the platform admin) or of a member (their org's
        admin, or the platform admin)."""
        principal.require("usage:read")
        if body.soft is None and body.hard is None:
            raise InvalidInput("give a soft limit, a hard limit or both", details={"field": "hard"})
        if body.soft is not None and body.hard is not None and body.soft > body.hard:
            raise InvalidInput(
                f"soft: {body.soft:g} is above the hard limit {body.hard:g}; a soft limit warns before the hard one",
                details={"field": "soft"},
            )
        with self.db.transaction() as s:
            org, user = self._scope(s, principal, body.org, body.user)
            if user is None and not principal.platform_admin:
                raise Forbidden(
                    "an organisation's budget is the platform admin's to set; an organisation's admin sets its "
                    "members' (give user)"
                )
            user_id = "" if user is None else user.id
            row = s.scalar(select(Budget).where(Budget.org_id == org.id, Budget.user_id == user_id))
            if row is None:
                row = Budget(id=new_id("bud"), org_id=org.id, user_id=user_id, created_by=principal.user_id)
                s.add(row)
            row.soft, row.hard, row.stop_running = body.soft, body.hard, body.stop_running
            row.warned_month = row.stopped_month = ""  # a new limit warns (and stops) afresh
            row.updated_at = utcnow()
            s.flush()
            self._forget(org.id, user_id)
            read = self._read(s, row, org.name, None if user is None else user.name)
        self.wake()  # the usage pass: stops the running work (stop_running), tells a mark already crossed
        return read

    def remove(self, principal: Principal, budget_id: str) -> None:
        principal.require("usage:read")
        with self.db.transaction() as s:
            row = self._load(s, principal, budget_id)
            if not row.user_id and not principal.platform_admin:
                raise Forbidden("an organisation's budget is the platform admin's to remove")
            s.delete(row)

    def list_budgets(self, principal: Principal, org: str | None = None) -> list[BudgetRead]:
        """The budgets the caller may see: every one (the platform admin), their organisation's (its admin), or
        those that apply to them (a member: the organisation's and their own); ``org`` narrows to one."""
        principal.require("jobs:read")
        with self.db.read() as s:
            query = select(Budget, Organization.name, User.name).join(Organization, Organization.id == Budget.org_id)
            query = query.outerjoin(User, User.id == Budget.user_id).order_by(Organization.name, Budget.user_id)
            if org is not None:
                query = query.where(Budget.org_id == find_org(s, principal, org).id)
            if not principal.platform_admin:
                query = query.where(Budget.org_id == principal.org_id)
                if not principal.can("usage:read"):
                    query = query.where(Budget.user_id.in_(("", principal.user_id)))
            return [self._read(s, row, org_name, user_name) for row, org_name, user_name in s.execute(query)]

    def _scope(
        self, s: Session, principal: Principal, org: str | None, user: str | None
    ) -> tuple[Organization, User | None]:
        if user is not None:
            member, member_org = find_user(s, principal, user)
            if org is not None and find_org(s, principal, org).id != member_org.id:
                raise InvalidInput(f"user: {user} is not a member of organisation {org}", details={"field": "user"})
            return member_org, member
        if org is None:
            found = s.get(Organization, principal.org_id)
            if found is None:
                raise NotFound(f"organisation {principal.org_id} not found")
            return found, None
        return find_org(s, principal, org), None

    def _load(self, s: Session, principal: Principal, budget_id: str) -> Budget:
        row = s.get(Budget, budget_id)
        if row is None or not (principal.platform_admin or row.org_id == principal.org_id):
            raise NotFound(f"budget {budget_id} not found")
        return row

    def _read(self, s: Session, row: Budget, org_name: str, user_name: str | None) -> BudgetRead:
        month = Month.of(time.time())
        used = self._cost(s, row.org_id, row.user_id, month, fresh=True)
        return BudgetRead(
            id=row.id,
            org_id=row.org_id,
            org_name=org_name,
            user_id=row.user_id or None,
            user_name=user_name,
            soft=row.soft,
            hard=row.hard,
            stop_running=row.stop_running,
            month=month.name,
            used=round(used, 6),
            resets_at=datetime.fromtimestamp(month.end, UTC),
            state=_state(row, used),
            currency=self.usage.currency,
        )

    # -- enforcing ----------------------------------------------------------------------------------------

    def check(self, s: Session, principal: Principal) -> None:
        """BudgetExceeded when a hard budget of the caller's organisation, or of the caller, is spent (a submit's
        check, in its transaction ``s``)."""
        month = Month.of(time.time())
        for row in self._budgets(s, principal.org_id, principal.user_id):
            if row.hard is None:
                continue
            used = self._cost(s, row.org_id, row.user_id, month)
            if used >= row.hard:
                whose = f"organisation {principal.org_name}" if not row.user_id else f"user {principal.user_name}"
                raise BudgetExceeded(
                    f"budget: the {month.name} budget {row.id} of {whose} is spent ({self._money(used)} used of its "
                    f"hard limit {self._money(row.hard)}); new work is refused until it resets on "
                    f"{datetime.fromtimestamp(month.end, UTC):%Y-%m-%d %H:%M} UTC, or the limit is raised",
                    details={
                        "budget": row.id,
                        "used": round(used, 6),
                        "hard": row.hard,
                        "month": month.name,
                        "resets_at": datetime.fromtimestamp(month.end, UTC).isoformat(),
                    },
                )

    def warnings(self, s: Session, org_id: str, user_id: str) -> list[str]:
        """What a new job of ``user_id`` is warned of (budgets of its scope past their soft limit), in the
        transaction that creates it; the first warning of a month goes to the audit too."""
        month = Month.of(time.time())
        out: list[str] = []
        for row in self._budgets(s, org_id, user_id):
            if row.soft is None:
                continue
            used = self._cost(s, row.org_id, row.user_id, month)
            if used < row.soft:
                continue
            whose = "the organisation's" if not row.user_id else "its user's"
            message = (
                f"budget: {whose} {month.name} budget {row.id} is past its soft limit ({self._money(used)} used of "
                f"{self._money(row.soft)}"
                + (f"; new work is refused at {self._money(row.hard)}" if row.hard is not None else "")
                + ")"
            )
            out.append(message)
            if row.warned_month != month.name:
                row.warned_month = month.name
                _audit(s, row, "budget.soft_limit", "warned", message)
                _tell(s, row, "budget.soft_limit", message, month)
        return out

    def usage_pass(self, s: Session) -> None:
        """One run of the leased task ``usage``, in its fenced transaction ``s``: what lately ended holds used,
        written again from their metrics; the settled holds added into usage_hours; the running work of spent
        budgets that say so, stopped."""
        self.usage.settle(s)
        self.usage.roll(s)
        self.enforce(s)
        self.marks(s)

    def marks(self, s: Session) -> None:
        """Tell each budget's soft and hard mark to its subscriptions once a month (budget.soft_limit,
        budget.hard_limit), whether new work or the running work crossed it (the leased task ``usage``)."""
        month = Month.of(time.time())
        for row in s.scalars(select(Budget).where(or_(Budget.soft.is_not(None), Budget.hard.is_not(None)))):
            used = self._cost(s, row.org_id, row.user_id, month)
            state = _state(row, used)
            if state != "ok" and row.soft is not None:
                spent = f"{self._money(used)} used of its soft limit {self._money(row.soft)}"
                _tell(s, row, "budget.soft_limit", f"budget {row.id} is past its soft limit ({spent})", month)
            if state == "hard" and row.hard is not None:
                spent = f"{self._money(used)} used of its hard limit {self._money(row.hard)}"
                _tell(s, row, "budget.hard_limit", f"budget {row.id} is spent ({spent}): new work is refused", month)

    def enforce(self, s: Session) -> int:
        """Cancel the active jobs of every budget that says ``stop_running`` and whose hard limit is spent (the
        leased task ``usage``, in its fenced transaction ``s``); how many were asked to stop."""
        month = Month.of(time.time())
        stopped = 0
        for row in s.scalars(select(Budget).where(Budget.stop_running.is_(True), Budget.hard.is_not(None))):
            assert row.hard is not None
            used = self._cost(s, row.org_id, row.user_id, month, fresh=True)
            if used < row.hard:
                continue
            query = select(Job).where(Job.org_id == row.org_id, Job.state.not_in([str(x) for x in TERMINAL_STATES]))
            if row.user_id:
                query = query.where(Job.user_id == row.user_id)
            spent = f"{self._money(used)} of {self._money(row.hard)}"
            message = f"cancelled: budget {row.id} is spent ({spent}) and stops running work"
            for job in s.scalars(query):
                stopped += int(request_cancel(s, job, message))
            if row.stopped_month != month.name:
                row.stopped_month = month.name
                detail = f"budget {row.id} spent ({spent}): its running work stopped"
                _audit(s, row, "budget.stop_running", "success", detail)
                _tell(s, row, "budget.hard_limit", detail, month)
        return stopped

    # -- the month's cost ---------------------------------------------------------------------------------

    def _budgets(self, s: Session, org_id: str, user_id: str) -> list[Budget]:
        """The budgets of the organisation and of the user. Where there are none they are not looked for again
        for ``FRESH_SECONDS`` (as a cost is not read again): a budget set through this server applies at once,
        one set through another server of the same database within that time."""
        now = time.monotonic()
        with self._lock:
            if now - self._none.get((org_id, user_id), float("-inf")) < FRESH_SECONDS:
                return []
        rows = list(s.scalars(select(Budget).where(Budget.org_id == org_id, Budget.user_id.in_(("", user_id)))))
        if not rows:
            with self._lock:
                self._none[(org_id, user_id)] = now
        return rows

    def _cost(self, s: Session, org_id: str, user_id: str, month: Month, *, fresh: bool = False) -> float:
        key = (org_id, user_id, month.name)
        now = time.monotonic()
        with self._lock:
            known = self._costs.get(key)
        if known is not None and not fresh and now - known[1] < FRESH_SECONDS:
            return known[0]
        cost = self.usage.cost(s, org_id, user_id or None, month.start, time.time())
        with self._lock:
            self._costs[key] = (cost, now)
        return cost

    def _money(self, amount: float) -> str:
        return format_money(amount, self.usage.currency)

    def _forget(self, org_id: str, user_id: str) -> None:
        with self._lock:
            for scope in [k for k in self._none if k[0] == org_id and user_id in ("", k[1])]:
                del self._none[scope]  # an organisation's budget is every member's
            for key in [k for k in self._costs if k[:2] == (org_id, user_id)]:
                del self._costs[key]


def _state(row: Budget, used: float) -> Literal["ok", "soft", "hard"]:
    if row.hard is not None and used >= row.hard:
        return "hard"
    if row.soft is not None and used >= row.soft:
        return "soft"
    return "ok"


def _subject(row: Budget) -> notification_outbox.Subject:
    return notification_outbox.Subject("budget", row.org_id, row.id, row.id, row.user_id or None, "/usage")


def _tell(s: Session, row: Budget, kind: str, message: str, month: Month) -> None:
    """Record ``kind`` for budget ``row`` in the notification outbox, unless it was this month since the budget was
    last set (the outbox is the record: a submission's warning, the stop of running work and the usage pass each
    tell a mark, once; a new limit is told afresh)."""
    told = s.scalar(
        select(NotificationEvent.id)
        .where(
            NotificationEvent.type == kind,
            NotificationEvent.org_id == row.org_id,
            NotificationEvent.name == row.id,
            NotificationEvent.created_at >= max(datetime.fromtimestamp(month.start, UTC), row.updated_at),
        )
        .limit(1)
    )
    if told is None:
        notification_outbox.recorded(s, kind, _subject(row), state=kind.split(".")[1].split("_")[0], message=message)


def _audit(s: Session, row: Budget, action: str, outcome: str, detail: str) -> None:
    """An audit entry of the platform's own about budget ``row`` (once a month per budget: the callers' marks)."""
    entry = audit.AuditEntry(
        action=action,
        resource=f"budget={row.id}",
        outcome=outcome,
        status=200,
        client="",
        org_id=row.org_id,
        user_id=row.user_id or None,
        detail=detail,
    )
    audit.add(s, entry)
