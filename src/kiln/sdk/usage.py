"""Usage and prices: a mixin of ``kiln.Client``.

report = client.usage(by="user", since="2026-11-01T00:00:00Z")     # org admins: their organisation
for row in report.rows: print(row.name, row.cpu_seconds, row.cost)
client.set_prices(cpu_hour=0.05, gpu_hour={"H200": 3.2})          # the platform admin
client.set_budget(org="vision", soft=800, hard=1000)               # a monthly budget (the platform admin)
"""

from __future__ import annotations

from datetime import UTC, datetime

from kiln.domain.usage import BudgetList, BudgetRead, BudgetSet, PriceList, PriceSet, PriceVersion, UsageReport
from kiln.sdk.transport import ClientTransport


def _iso(value: datetime | str | None) -> str | None:
    """ISO-8601 in UTC; a naive datetime is taken as local time. Strings pass as given."""
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else value


def _params(
    by: str,
    org: str | None,
    since: datetime | str | None,
    until: datetime | str | None,
    split: str | None,
    limit: int | None,
) -> dict[str, str | int | None]:
    return {"by": by, "org": org, "since": _iso(since), "until": _iso(until), "split": split, "limit": limit}


class UsageMixin(ClientTransport):
    """The usage and price methods of ``kiln.Client``."""

    def usage(
        self,
        by: str = "user",
        org: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        *,
        split: str | None = None,
        limit: int | None = None,
    ) -> UsageReport:
        """CPU, memory and GPU seconds held (and CPU seconds used) and their cost, grouped ``by`` org, user, job,
        category, gpu_type or day and, with ``split``, by a second of those, in [since, until) (default: the
        last 30 days); ``limit``: the top rows only."""
        params = _params(by, org, since, until, split, limit)
        return UsageReport.model_validate(self.request("GET", "/usage", params=params).json())

    def usage_csv(
        self,
        by: str = "user",
        org: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        *,
        split: str | None = None,
        limit: int | None = None,
    ) -> str:
        params = {**_params(by, org, since, until, split, limit), "format": "csv"}
        return str(self.request("GET", "/usage", params=params).text)

    def prices(self) -> list[PriceVersion]:
        return PriceList.model_validate(self.request("GET", "/prices").json()).items

    def set_prices(
        self,
        cpu_hour: float | None = None,
        memory_gib_hour: float | None = None,
        gpu_hour: dict[str, float] | None = None,
        category: str | None = None,
    ) -> PriceVersion:
        """A new price version from now on (the platform admin); rates not given are carried over."""
        body = PriceSet(cpu_hour=cpu_hour, memory_gib_hour=memory_gib_hour, gpu_hour=gpu_hour or {}, category=category)
        answer = self.request("POST", "/prices", json_body=body.model_dump(mode="json", exclude_none=True))
        return PriceVersion.model_validate(answer.json())

    def budgets(self, org: str | None = None) -> list[BudgetRead]:
        """The budgets the caller may see (a member: those that apply to them), with this month's use."""
        return BudgetList.model_validate(self.request("GET", "/budgets", params={"org": org}).json()).items

    def set_budget(
        self,
        *,
        org: str | None = None,
        user: str | None = None,
        soft: float | None = None,
        hard: float | None = None,
        stop_running: bool = False,
    ) -> BudgetRead:
        """Set a monthly budget on an organisation (the platform admin) or, with ``user``, a member (their org's
        admin): past ``soft`` new work is warned of, past ``hard`` refused (``kiln.errors.BudgetExceeded``);
        ``stop_running``: past ``hard`` the running work is stopped too."""
        body = BudgetSet(org=org, user=user, soft=soft, hard=hard, stop_running=stop_running)
        answer = self.request("PUT", "/budgets", json_body=body.model_dump(mode="json", exclude_none=True))
        return BudgetRead.model_validate(answer.json())

    def remove_budget(self, budget_id: str) -> None:
        self.request("DELETE", f"/budgets/{budget_id}")
