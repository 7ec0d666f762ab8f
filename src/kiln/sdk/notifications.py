"""Notifications: a mixin of ``kiln.Client``.

sub = client.subscribe("nightly", ["job.failed"], url="https://hooks.example.com/kiln")
print(sub.secret)                                   # whsec_…: shown once; receivers verify with it
client.test_subscription(sub.id)                    # a test event, now
for d in client.deliveries(sub.id): print(d.status, d.response_code, d.latency_ms)
"""

from __future__ import annotations

from kiln.domain.notifications import (
    DeliveryList,
    DeliveryRead,
    SubscriptionCreate,
    SubscriptionList,
    SubscriptionRead,
    SubscriptionUpdate,
)
from kiln.sdk.transport import ClientTransport

BASE = "/notifications/subscriptions"


class NotificationsMixin(ClientTransport):
    """The notification methods of ``kiln.Client``."""

    def subscribe(
        self,
        name: str,
        events: list[str],
        *,
        url: str | None = None,
        email: str | None = None,
        format: str = "standard",
        labels: dict[str, str] | None = None,
        name_pattern: str | None = None,
        owner: str | None = None,
        all_orgs: bool = False,
    ) -> SubscriptionRead:
        """Subscribe a webhook ``url`` (signed with the secret in the answer, shown only here) or an ``email``
        address to ``events`` (job.failed, job.*, …), narrowed by the subject's labels, name glob or owner."""
        body = SubscriptionCreate(
            name=name,
            events=events,
            url=url,
            email=email,
            format=format,  # type: ignore[arg-type]
            labels=labels or {},
            name_pattern=name_pattern,
            owner=owner,
            all_orgs=all_orgs,
        )
        answer = self.request("POST", BASE, json_body=body.model_dump(mode="json", exclude_none=True))
        return SubscriptionRead.model_validate(answer.json())

    def subscriptions(self) -> list[SubscriptionRead]:
        """The caller's subscriptions (an org admin: the organisation's)."""
        return SubscriptionList.model_validate(self.request("GET", BASE).json()).items

    def subscription(self, subscription_id: str) -> SubscriptionRead:
        return SubscriptionRead.model_validate(self.request("GET", f"{BASE}/{subscription_id}").json())

    def pause_subscription(self, subscription_id: str, paused: bool = True) -> SubscriptionRead:
        """Pause it (``paused=False``: resume it, its failures forgotten)."""
        body = SubscriptionUpdate(paused=paused).model_dump(mode="json")
        return SubscriptionRead.model_validate(
            self.request("PATCH", f"{BASE}/{subscription_id}", json_body=body).json()
        )

    def unsubscribe(self, subscription_id: str) -> None:
        self.request("DELETE", f"{BASE}/{subscription_id}")

    def test_subscription(self, subscription_id: str) -> DeliveryRead:
        """Send it a test event now; its delivery (pending) to follow in ``deliveries``."""
        return DeliveryRead.model_validate(self.request("POST", f"{BASE}/{subscription_id}/test").json())

    def deliveries(self, subscription_id: str, limit: int = 100) -> list[DeliveryRead]:
        """Its delivery log, newest first."""
        answer = self.request("GET", f"{BASE}/{subscription_id}/deliveries", params={"limit": limit})
        return DeliveryList.model_validate(answer.json()).items

    def resend_delivery(self, subscription_id: str, delivery_id: str) -> DeliveryRead:
        """Send a delivery again now (the same webhook-id)."""
        path = f"{BASE}/{subscription_id}/deliveries/{delivery_id}/resend"
        return DeliveryRead.model_validate(self.request("POST", path).json())
