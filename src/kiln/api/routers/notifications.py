"""Notifications: subscriptions (a webhook or an e-mail address for chosen events), their delivery log, a test
event and "send again". What a webhook's body looks like is published as the document's ``webhooks``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from kiln.api.deps import Caller, Kiln
from kiln.api.responses import errors
from kiln.domain import limits
from kiln.domain.notifications import (
    DeliveryList,
    DeliveryRead,
    SlackMessage,
    SubscriptionCreate,
    SubscriptionList,
    SubscriptionRead,
    SubscriptionUpdate,
    WebhookEvent,
)

router = APIRouter(prefix="/notifications", tags=["notifications"], responses=errors(403))
SubscriptionId = Annotated[
    str, Path(max_length=limits.MAX_ID_LENGTH, description="A subscription id, e.g. sub-01jd5y3c2k7q4m9x2a")
]
DeliveryId = Annotated[str, Path(max_length=limits.MAX_ID_LENGTH, description="A delivery id, e.g. dlv-01jd…")]
BY_ID = "/subscriptions/{subscription_id}"


@router.get("/subscriptions", response_model=SubscriptionList, summary="The subscriptions the caller may see")
def list_subscriptions(caller: Caller, kiln: Kiln) -> SubscriptionList:
    return SubscriptionList(items=kiln.notifications.list_subscriptions(caller))


@router.post(
    "/subscriptions",
    response_model=SubscriptionRead,
    status_code=201,
    summary="Subscribe a webhook or an e-mail address to events (the webhook's secret is in this answer only)",
    responses=errors(404, 422),
)
def create_subscription(body: SubscriptionCreate, caller: Caller, kiln: Kiln) -> SubscriptionRead:
    return kiln.notifications.create(caller, body)


@router.get(BY_ID, response_model=SubscriptionRead, summary="One subscription", responses=errors(404, 422))
def get_subscription(subscription_id: SubscriptionId, caller: Caller, kiln: Kiln) -> SubscriptionRead:
    return kiln.notifications.get(caller, subscription_id)


@router.patch(BY_ID, response_model=SubscriptionRead, summary="Pause or resume it", responses=errors(404, 422))
def update_subscription(
    subscription_id: SubscriptionId, body: SubscriptionUpdate, caller: Caller, kiln: Kiln
) -> SubscriptionRead:
    return kiln.notifications.update(caller, subscription_id, body)


@router.delete(BY_ID, status_code=204, summary="Remove it and its delivery log", responses=errors(404, 422))
def delete_subscription(subscription_id: SubscriptionId, caller: Caller, kiln: Kiln) -> Response:
    kiln.notifications.remove(caller, subscription_id)
    return Response(status_code=204)


@router.post(
    BY_ID + "/test",
    response_model=DeliveryRead,
    status_code=202,
    summary="Send it a test event now (its delivery is in the log)",
    responses=errors(404, 422),
)
def test_subscription(subscription_id: SubscriptionId, caller: Caller, kiln: Kiln) -> DeliveryRead:
    return kiln.notifications.send_test(caller, subscription_id)


@router.get(
    BY_ID + "/deliveries",
    response_model=DeliveryList,
    summary="Its delivery log, newest first: status, attempts, response code, latency",
    responses=errors(404, 422),
)
def list_deliveries(
    subscription_id: SubscriptionId,
    caller: Caller,
    kiln: Kiln,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> DeliveryList:
    return DeliveryList(items=kiln.notifications.deliveries(caller, subscription_id, limit))


@router.post(
    BY_ID + "/deliveries/{delivery_id}/resend",
    response_model=DeliveryRead,
    status_code=202,
    summary="Send a delivery again now (the same webhook-id)",
    responses=errors(404, 422),
)
def resend_delivery(
    subscription_id: SubscriptionId, delivery_id: DeliveryId, caller: Caller, kiln: Kiln
) -> DeliveryRead:
    return kiln.notifications.resend(caller, subscription_id, delivery_id)


# What Kiln POSTs to a subscription's URL (OpenAPI 3.1 webhooks): its body in either format, and the headers.
webhooks = APIRouter()
HEADERS = (
    "Signed per Standard Webhooks: webhook-id (the event's id), webhook-timestamp (Unix seconds) and "
    "webhook-signature (v1,base64 HMAC-SHA256 of 'id.timestamp.body' under the subscription's whsec_ secret)."
)
# The receiver's answers are its own: no 422 of FastAPI's (HTTPValidationError) is published for them.
NO_422: dict[int | str, dict[str, Any]] = {
    422: {"description": "Not Kiln's: the receiver answers as it will (any 4xx: not retried)."}
}


@webhooks.post(
    "job-event",
    summary="Any event: a job's end, a study's best trial, a test … (format standard)",
    description=HEADERS,
    responses=NO_422,
)
def job_event(body: WebhookEvent) -> None:
    """Answer 2xx to accept it; a 5xx or no answer within the timeout is retried, any 4xx is not."""


@webhooks.post("slack-message", summary="The same event in format slack", description=HEADERS, responses=NO_422)
def slack_message(body: SlackMessage) -> None:
    """An incoming webhook's body: {"text": …} with a link to the console's page."""
