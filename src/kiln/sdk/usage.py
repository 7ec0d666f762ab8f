"""Usage and prices: a mixin of ``kiln.Client``.

report = client.usage(by="user", since="2026-11-01T00:00:00Z")     # org admins: their organisation
for row in report.rows: print(row.name, row.cpu_seconds, row.cost)
client.set_prices(cpu_hour=0.05, gpu_hour={"H200": 3.2})          # the platform admin
"""

from __future__ import annotations

from datetime import UTC, datetime

from kiln.domain.usage import PriceList, PriceSet, PriceVersion, UsageReport
from kiln.sdk.transport import ClientTransport


def _iso(value: datetime | str | None) -> str | None:
    """ISO-8601 in UTC; a naive datetime is taken as local time. Strings pass as given."""
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else value


class UsageMixin(ClientTransport):
    """The usage and price methods of ``kiln.Client``."""

    def usage(
        self,
        by: str = "user",
        org: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> UsageReport:
        """CPU, memory and GPU seconds held and their cost, grouped ``by`` org, user, job, category, gpu_type or
        day, in [since, until) (default: the last 30 days)."""
        params = {"by": by, "org": org, "since": _iso(since), "until": _iso(until)}
        return UsageReport.model_validate(self.request("GET", "/usage", params=params).json())

    def usage_csv(
        self,
        by: str = "user",
        org: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
    ) -> str:
        params = {"by": by, "org": org, "since": _iso(since), "until": _iso(until), "format": "csv"}
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
