"""``kiln audit``: who did what, when (organisation admins: their organisation; platform admins: all)."""

from __future__ import annotations

from typing import Annotated

import typer

from kiln.cli.common import Output, OutputFormat, connect, emit_list
from kiln.cli.output import audit_table
from kiln.cli.parsing import TIME_HINT, parse_time


def _time(value: str | None, flag: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value).isoformat()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


def audit(
    since: Annotated[str | None, typer.Option(help=f"Events from then on: {TIME_HINT}.")] = None,
    until: Annotated[str | None, typer.Option(help="Events before then (same forms as --since).")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's (id or name).")] = None,
    action: Annotated[
        str | None, typer.Option(help="Only actions containing this text, e.g. create_org, submit.")
    ] = None,
    org: Annotated[str | None, typer.Option(help="Only this organisation's (id or name).")] = None,
    outcome: Annotated[
        str | None, typer.Option(help="Only this outcome: success, failed, denied or unauthenticated.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many (newest first).")] = 100,
    output: Output = OutputFormat.table,
) -> None:
    """The audit log: changes made through the API and failed sign-ins."""
    start, end = _time(since, "--since"), _time(until, "--until")
    with connect() as client:
        events = client.audit(since=start, until=end, user=user, action=action, org=org, outcome=outcome, limit=limit)
    emit_list(events, output, audit_table, "no audit events")
