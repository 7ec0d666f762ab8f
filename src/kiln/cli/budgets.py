"""``kiln budgets``: monthly cost limits on an organisation (the platform admin sets them) or on one member (their
organisation's admin): past the soft limit new work is warned of, past the hard one refused."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from kiln.cli.common import connect, emit_json, info, out
from kiln.cli.output import fmt_time
from kiln.domain.usage import BudgetRead, format_money

app = typer.Typer(help="Monthly budgets on what an organisation or a member spends.", no_args_is_help=True)


def _limit(value: float | None) -> str:
    return format_money(value)  # as the console prints it: 0.0015, not 0.00


def _table(budgets: list[BudgetRead]) -> None:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    unit = f" ({budgets[0].currency})" if budgets and budgets[0].currency else ""
    for column in ("ID", "ORG", "USER", "MONTH", "USED", "SOFT", "HARD", "STATE", "STOPS RUNNING", "RESETS"):
        amount = column in ("USED", "SOFT", "HARD")
        table.add_column(column + unit if amount else column, justify="right" if amount else "left")
    for b in budgets:
        table.add_row(
            b.id,
            b.org_name,
            b.user_name or "-",
            b.month,
            format_money(b.used),
            _limit(b.soft),
            _limit(b.hard),
            b.state,
            "yes" if b.stop_running else "no",
            fmt_time(b.resets_at),
        )
    out.print(table)


@app.command("list")
def list_budgets(
    org: Annotated[str | None, typer.Option("--org", help="One organisation's (the platform admin).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """The budgets you may see, with this month's use (a member: those that apply to them)."""
    with connect() as client:
        budgets = client.budgets(org)
    if output == "json":
        emit_json([b.model_dump(mode="json") for b in budgets])
    elif not budgets:
        info("no budgets")
    else:
        _table(budgets)


@app.command("set")
def set_budget(
    org: Annotated[str | None, typer.Option("--org", help="The organisation (default: yours).")] = None,
    user: Annotated[str | None, typer.Option("--user", help="A member's budget (default: the organisation's).")] = None,
    soft: Annotated[float | None, typer.Option("--soft", min=0, help="Warn of new work past this.")] = None,
    hard: Annotated[float | None, typer.Option("--hard", min=0, help="Refuse new work past this.")] = None,
    stop_running: Annotated[
        bool, typer.Option("--stop-running", help="Past the hard limit, stop the running work too.")
    ] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """Set (create or replace) a monthly budget, counted under the price table (`kiln prices`)."""
    with connect() as client:
        budget = client.set_budget(org=org, user=user, soft=soft, hard=hard, stop_running=stop_running)
    if output == "json":
        emit_json(budget.model_dump(mode="json"))
    else:
        _table([budget])


@app.command("rm")
def remove_budget(budget_id: Annotated[str, typer.Argument(help="The budget's id (kiln budgets list).")]) -> None:
    """Remove a budget."""
    with connect() as client:
        client.remove_budget(budget_id)
    info(f"budget {budget_id} removed")
