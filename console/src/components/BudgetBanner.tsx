// The budgets banner at the top of every page: a budget that applies to the signed-in user (their organisation's,
// their own; an admin sees the organisation's members' too) past its soft limit is a warning, past its hard limit
// an error (new work is refused until the month resets). GET /budgets is asked once per page load and signed-in
// user (the app's shell stays mounted as pages change); no budgets, or a failed call, and there is no banner.

import { useEffect, useState } from "preact/hooks";
import { get } from "../api";
import { money, time } from "../format";
import { Link } from "../router";
import { useAbilities, useSession } from "../session";
import type { Budget, Items } from "../types";

const SHOWN = 3; // banners at most; the rest are counted

/** One sentence on a budget past a limit, naming whose it is ("Organisation labs has used 85.00 of its 80.00 soft
 * budget for 2026-12."); "" for one within its limits. */
export function budgetMessage(b: Budget, me: string | undefined): string {
  const mine = Boolean(b.user_id) && b.user_id === me;
  const who = !b.user_id ? `Organisation ${b.org_name} has` : mine ? "You have" : `User ${b.user_name ?? b.user_id} (${b.org_name}) has`;
  const its = !b.user_id ? "its" : mine ? "your" : "their";
  if (b.state === "hard" && b.hard !== null) {
    const stops = b.stop_running ? "; its running work is stopped too" : "";
    return `${who} used ${money(b.used, b.currency)} of ${its} ${money(b.hard, b.currency)} hard budget for ${b.month}: new work is refused until ${time(b.resets_at)}${stops}.`;
  }
  if (b.state === "soft" && b.soft !== null) {
    const then = b.hard !== null ? ` New work will be refused at ${money(b.hard, b.currency)}.` : "";
    return `${who} used ${money(b.used, b.currency)} of ${its} ${money(b.soft, b.currency)} soft budget for ${b.month}.${then}`;
  }
  return "";
}

export function BudgetBanner() {
  const session = useSession();
  const can = useAbilities();
  const me = session?.user.user_id;
  const [budgets, setBudgets] = useState<Budget[]>([]);

  useEffect(() => {
    setBudgets([]);
    if (!me) return undefined;
    const abort = new AbortController();
    get<Items<Budget>>("/budgets", undefined, abort.signal)
      .then((answer) => setBudgets(answer.items))
      .catch(() => {}); // no banner: the budgets are a hint here, the server enforces them
    return () => abort.abort();
  }, [me]);

  const over = budgets
    .filter((b) => (b.state === "hard" || b.state === "soft") && budgetMessage(b, me))
    .sort((a, b) => Number(b.state === "hard") - Number(a.state === "hard"));
  if (!over.length) return null;
  return (
    <div class="banners" data-testid="budget-banner">
      {over.slice(0, SHOWN).map((b) => {
        const hard = b.state === "hard";
        return (
          <div key={b.id} class={hard ? "banner bad" : "banner warn"} role={hard ? "alert" : "status"} data-testid="budget-banner-line" data-budget={b.id} data-state={b.state}>
            <strong>{hard ? "Budget spent." : "Budget warning."}</strong> <span title={hard ? `resets at ${b.resets_at}` : undefined}>{budgetMessage(b, me)}</span>
            {can.orgAdmin ? (
              <>
                {" "}
                <Link href="/usage">See usage</Link>
              </>
            ) : null}
          </div>
        );
      })}
      {over.length > SHOWN ? (
        <div class="banner warn" role="status">
          And {over.length - SHOWN} more budget{over.length - SHOWN > 1 ? "s" : ""} past a limit{can.orgAdmin ? <> (<Link href="/usage">see usage</Link>)</> : null}.
        </div>
      ) : null}
    </div>
  );
}
