"""``kiln notify``: subscriptions of webhooks and e-mail addresses to events (a job's end, its failure …), their
delivery log, a test event and "send again"."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from kiln.cli.common import connect, emit_json, info, out
from kiln.cli.output import fmt_time
from kiln.cli.spec import parse_pairs
from kiln.domain.notifications import DeliveryRead, SubscriptionRead

app = typer.Typer(help="Notifications: webhooks and e-mails when jobs end or fail.", no_args_is_help=True)
Output = Annotated[str, typer.Option("--output", "-o", help="table or json.")]


def _subscriptions(items: list[SubscriptionRead]) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("ID", "NAME", "EVENTS", "TO", "FORMAT", "STATE", "FAILURES"):
        table.add_column(column)
    for s in items:
        state = s.state if not s.paused_reason else f"{s.state}: {s.paused_reason}"
        table.add_row(
            s.id, escape(s.name), ",".join(s.events), escape(s.target), s.format, escape(state), str(s.failures)
        )
    out.print(table)


def _deliveries(items: list[DeliveryRead]) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in ("ID", "EVENT", "TYPE", "STATUS", "ATTEMPTS", "CODE", "LATENCY", "WHEN", "ERROR"):
        table.add_column(column)
    for d in items:
        latency = "-" if d.latency_ms is None else f"{d.latency_ms:.0f} ms"
        table.add_row(
            d.id,
            d.event_id,
            d.event_type,
            d.status,
            str(d.attempts),
            "-" if d.response_code is None else str(d.response_code),
            latency,
            fmt_time(d.created_at),
            escape(d.error or ""),  # the receiver's words, printed as text, never as markup
        )
    out.print(table)


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="What it is for, e.g. nightly-failures.")],
    events: Annotated[
        str,
        typer.Option(
            "--events",
            "-e",
            help=(
                "Comma-separated types or globs: job.failed, job.*, study.best_trial, pipeline_run.*, budget.*, "
                "model.*, notebook.culled, service.*, subscription.paused, *."
            ),
        ),
    ] = "job.failed",
    url: Annotated[str | None, typer.Option("--url", help="A webhook target (http or https).")] = None,
    email: Annotated[str | None, typer.Option("--email", help="An e-mail address (the operator's SMTP).")] = None,
    slack: Annotated[bool, typer.Option("--slack", help='Send Slack\'s {"text": …} body.')] = False,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="Only subjects with KEY=VALUE.")] = None,
    match: Annotated[str | None, typer.Option("--match", help="Only subjects whose name matches this glob.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Only this user's subjects.")] = None,
    all_orgs: Annotated[bool, typer.Option("--all-orgs", help="Every organisation's (the platform admin).")] = False,
    output: Output = "table",
) -> None:
    """Subscribe a webhook URL or an e-mail address to events. A webhook's signing secret is printed once."""
    with connect() as client:
        sub = client.subscribe(
            name,
            [x.strip() for x in events.split(",") if x.strip()],
            url=url,
            email=email,
            format="slack" if slack else "standard",
            labels=parse_pairs(label, "--label"),
            name_pattern=match,
            owner=owner,
            all_orgs=all_orgs,
        )
    if output == "json":
        emit_json(sub.model_dump(mode="json"))
        return
    _subscriptions([sub])
    if sub.secret:
        info(f"signing secret (shown once; verify webhook-signature with it): {sub.secret}")


@app.command("list")
def list_subscriptions(output: Output = "table") -> None:
    """Your subscriptions (an org admin: the organisation's)."""
    with connect() as client:
        items = client.subscriptions()
    if output == "json":
        emit_json([s.model_dump(mode="json") for s in items])
    elif not items:
        info("no subscriptions (kiln notify add NAME --url URL)")
    else:
        _subscriptions(items)


@app.command("rm")
def remove(subscription: Annotated[str, typer.Argument(help="A subscription id.")]) -> None:
    """Remove a subscription and its delivery log."""
    with connect() as client:
        client.unsubscribe(subscription)
    info(f"removed {subscription}")


@app.command("pause")
def pause(subscription: Annotated[str, typer.Argument(help="A subscription id.")]) -> None:
    """Pause a subscription: no deliveries until it is resumed."""
    with connect() as client:
        _subscriptions([client.pause_subscription(subscription)])


@app.command("resume")
def resume(subscription: Annotated[str, typer.Argument(help="A subscription id.")]) -> None:
    """Resume a paused subscription (its failures forgotten)."""
    with connect() as client:
        _subscriptions([client.pause_subscription(subscription, paused=False)])


@app.command("test")
def test(subscription: Annotated[str, typer.Argument(help="A subscription id.")]) -> None:
    """Send it a test event now (its outcome: kiln notify deliveries ID)."""
    with connect() as client:
        delivery = client.test_subscription(subscription)
    info(f"test event {delivery.event_id} queued as delivery {delivery.id}")


@app.command("deliveries")
def deliveries(
    subscription: Annotated[str, typer.Argument(help="A subscription id.")],
    resend: Annotated[str | None, typer.Option("--resend", metavar="DELIVERY", help="Send it again now.")] = None,
    limit: Annotated[int, typer.Option(help="The newest this many.")] = 50,
    output: Output = "table",
) -> None:
    """Its delivery log, newest first: status, attempts, response code, latency."""
    with connect() as client:
        if resend is not None:
            client.resend_delivery(subscription, resend)
            info(f"delivery {resend} is sent again")
        items = client.deliveries(subscription, limit)
    if output == "json":
        emit_json([d.model_dump(mode="json") for d in items])
    elif not items:
        info("no deliveries yet")
    else:
        _deliveries(items)
