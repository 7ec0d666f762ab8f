// Usage: what an organisation's work held and what it cost, in a window of the last 7, 30 or 90 days (UTC days, as
// the server counts them): cost per day as stacked bars (by user or by category), the totals (cost, CPU-hours held
// beside those used, GPU-hours), a table by user, the ten costliest jobs, a CSV download, the budgets and the
// prices in force. For organisation admins (their organisation) and the platform admin (all, or one); anyone else
// is told so by the server's refusal, and still sees the budgets that apply to them. The page's state is its URL
// (?days=&stack=&org=).

import { ApiError, seg, url } from "../api";
import { StackedBars, type StackBar, type StackSeries } from "../components/StackedBars";
import { Empty, ErrorBox, Loading, Section } from "../components/ui";
import { bytes, hours, money, time } from "../format";
import { useApi } from "../hooks";
import { Link, setQuery, useLocation } from "../router";
import { useAbilities } from "../session";
import type { Budget, Items, Org, PriceVersion, UsageGroup, UsageQuery, UsageReport } from "../types";

const WINDOWS = [7, 30, 90];
const STACKS: { id: UsageGroup; label: string }[] = [
  { id: "user", label: "user" },
  { id: "category", label: "category" },
];
const POLL_MS = 60_000; // a running job's use grows by the second; the page need not
const MAX_SERIES = 8; // segments per bar: the costliest seven, the rest as one
const OTHERS = "\u0000others"; // no user id or category is this
// Distinct for most kinds of colour vision (Okabe and Ito's, with the console's blue first); grey for the rest.
const PALETTE = ["#1d4ed8", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#7c3aed", "#b08d00"];
const OTHER_COLOR = "#9ca3af";
const CATEGORIES = ["train", "serve", "dev"]; // their order in a bar, whatever each cost

/** The window's days, oldest first: today (UTC, as the server splits days) and the `days - 1` before it. */
export function windowDays(days: number, now = new Date()): string[] {
  const today = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
  return Array.from({ length: days }, (_, i) => new Date(today - (days - 1 - i) * 86_400_000).toISOString().slice(0, 10));
}

/** The bars of a by=day&split=<stack> report: one per day of the window (a day without use is a bar of 0), each
 * split into its users' (or categories') cost; past MAX_SERIES the cheapest are one "others" segment. */
export function costPerDay(report: UsageReport, days: string[], stack: UsageGroup): { bars: StackBar[]; series: StackSeries[] } {
  const found = new Map<string, { name: string; cost: number }>();
  for (const row of report.rows) {
    const key = row.split ?? "";
    const seen = found.get(key) ?? { name: row.split_name ?? key, cost: 0 };
    seen.cost += row.cost;
    found.set(key, seen);
  }
  const rank = (k: string) => (CATEGORIES.includes(k) ? CATEGORIES.indexOf(k) : CATEGORIES.length);
  const keys = [...found.keys()].sort((a, b) =>
    stack === "category"
      ? rank(a) - rank(b) || a.localeCompare(b)
      : found.get(b)!.cost - found.get(a)!.cost || found.get(a)!.name.localeCompare(found.get(b)!.name),
  );
  const named = keys.length > MAX_SERIES ? keys.slice(0, MAX_SERIES - 1) : keys;
  const rest = new Set(keys.slice(named.length));
  const series: StackSeries[] = named.map((key, i) => ({ key, name: found.get(key)!.name || "—", color: PALETTE[i % PALETTE.length] }));
  if (rest.size) series.push({ key: OTHERS, name: `${rest.size} others`, color: OTHER_COLOR });

  // The server's days and the browser's agree unless the clocks straddle midnight: then its day is drawn too.
  const all = [...new Set([...days, ...report.rows.map((r) => r.key)])].sort();
  const values = new Map(all.map((d) => [d, {} as Record<string, number>]));
  for (const row of report.rows) {
    const bar = values.get(row.key)!;
    const key = rest.has(row.split ?? "") ? OTHERS : (row.split ?? "");
    bar[key] = (bar[key] ?? 0) + row.cost;
  }
  return { bars: all.map((d) => ({ key: d, label: d, tick: d.slice(5), values: values.get(d)! })), series };
}

const pct = (part: number, whole: number): string => (whole > 0 ? `${Math.round((part / whole) * 100)}%` : "—");

export function Usage() {
  const can = useAbilities();
  const { query } = useLocation();
  const days = WINDOWS.includes(Number(query.get("days"))) ? Number(query.get("days")) : 30;
  const stack: UsageGroup = query.get("stack") === "category" ? "category" : "user";
  const org = can.platformAdmin ? (query.get("org") ?? "") : "";
  const span = windowDays(days);
  const scope = { since: `${span[0]}T00:00:00Z`, org: org || undefined } satisfies UsageQuery;

  const perDay = useApi<UsageReport>("/usage", { ...scope, by: "day", split: stack } satisfies UsageQuery, POLL_MS);
  // Someone the role says may not read usage asks once (the server's refusal is what the page shows), not three times.
  const more = can.orgAdmin || perDay.data ? "/usage" : null;
  const perUser = useApi<UsageReport>(more, { ...scope, by: "user" } satisfies UsageQuery, POLL_MS);
  const topJobs = useApi<UsageReport>(more, { ...scope, by: "job", limit: 10 } satisfies UsageQuery, POLL_MS);
  const budgets = useApi<Items<Budget>>("/budgets", { org: org || undefined });
  const prices = useApi<Items<PriceVersion>>("/prices");
  const orgs = useApi<Items<Org>>(can.platformAdmin ? "/orgs" : null);
  const refused = [perDay, perUser, topJobs].map((r) => r.error).find((e) => e instanceof ApiError && e.status === 403);
  const whose = org ? `organisation ${org}` : can.platformAdmin ? "every organisation" : "your organisation";

  return (
    <div class="stack usage-page">
      <div class="page-head">
        <div>
          <h1>Usage</h1>
          {refused ? null : (
            <p class="muted small">
              What {whose} held and what it cost, {span[0]} to {span[span.length - 1]} (UTC days), under the prices in force while it ran.
            </p>
          )}
        </div>
      </div>
      {refused ? null : (
        <div class="card filter-bar" role="group" aria-label="What to show">
          <label class="field inline">
            <span class="label">Window</span>
            <select value={days} onChange={(e) => setQuery({ days: e.currentTarget.value === "30" ? null : e.currentTarget.value })} data-testid="usage-window">
              {WINDOWS.map((d) => (
                <option key={d} value={d}>
                  last {d} days
                </option>
              ))}
            </select>
          </label>
          <label class="field inline">
            <span class="label">Stack by</span>
            <select value={stack} onChange={(e) => setQuery({ stack: e.currentTarget.value === "user" ? null : e.currentTarget.value })} data-testid="usage-stack">
              {STACKS.map((s) => (
                <option key={s.id} value={s.id}>
                  {s.label}
                </option>
              ))}
            </select>
          </label>
          {can.platformAdmin ? (
            <label class="field inline">
              <span class="label">Organisation</span>
              <select value={org} onChange={(e) => setQuery({ org: e.currentTarget.value || null })} data-testid="usage-org">
                <option value="">all organisations</option>
                {[...new Set([...(orgs.data?.items.map((o) => o.name) ?? []), ...(org ? [org] : [])])].map((name) => (
                  <option key={name} value={name}>
                    {name}
                  </option>
                ))}
              </select>
            </label>
          ) : null}
          <a class="btn" href={url("/usage", { ...scope, by: "day", split: stack, format: "csv" })} download={`kiln-usage-${span[0]}.csv`} data-testid="usage-csv">
            Download CSV (per day, by {stack})
          </a>
        </div>
      )}

      {refused ? (
        <section class="card" data-testid="usage-refused">
          <h2>Usage is for organisation admins</h2>
          <p>Usage and cost are shown to an organisation's admins and to the platform admin. The server refused:</p>
          <ErrorBox error={refused} />
        </section>
      ) : (
        <>
          <Section title={`Cost per day, by ${stack}`} id="usage-chart-card">
            <ErrorBox error={perDay.error} />
            {!perDay.data ? (
              perDay.error ? null : <Loading />
            ) : (
              <CostChart report={perDay.data} days={span} stack={stack} />
            )}
            {prices.data && !prices.data.items.length ? (
              <p class="muted small" data-testid="usage-no-prices">
                No prices are set, so every cost is 0: the platform admin sets them (`kiln prices set --cpu-hour 0.05`).
              </p>
            ) : null}
          </Section>
          <Totals report={perUser.data} error={perUser.error} />
          <Section
            title="By user"
            id="usage-users"
            actions={
              <a href={url("/usage", { ...scope, by: "user", format: "csv" })} download={`kiln-usage-users-${span[0]}.csv`}>
                CSV
              </a>
            }
          >
            <ErrorBox error={perUser.error} />
            {!perUser.data ? perUser.error ? null : <Loading /> : <UsageTable report={perUser.data} by="user" />}
          </Section>
          <Section title="Top jobs by cost" id="usage-jobs">
            <ErrorBox error={topJobs.error} />
            {!topJobs.data ? topJobs.error ? null : <Loading /> : <UsageTable report={topJobs.data} by="job" />}
          </Section>
        </>
      )}
      <Section title={budgets.data?.items.length ? `Budgets for ${budgets.data.items[0].month}` : "Budgets"} id="usage-budgets">
        <ErrorBox error={budgets.error} />
        {!budgets.data ? budgets.error ? null : <Loading /> : <BudgetTable budgets={budgets.data.items} />}
      </Section>
      <Section title="Prices" id="usage-prices">
        <ErrorBox error={prices.error} />
        {!prices.data ? prices.error ? null : <Loading /> : <PriceTable versions={prices.data.items} />}
      </Section>
    </div>
  );
}

function CostChart({ report, days, stack }: { report: UsageReport; days: string[]; stack: UsageGroup }) {
  const { bars, series } = costPerDay(report, days, stack);
  return (
    <>
      <StackedBars bars={bars} series={series} format={(n) => money(n, report.currency)} label={`Cost per day by ${stack}`} testid="usage-chart" />
      {!report.rows.length ? <Empty>Nothing ran in this window.</Empty> : null}
    </>
  );
}

function Totals({ report, error }: { report: UsageReport | undefined; error: unknown }) {
  if (!report) return error ? null : <Loading what="Totals" />;
  const figures: [string, string, string, number, string?][] = [
    ["cost", "Cost", money(report.cost, report.currency), report.cost],
    ["cpu-held", "CPU-hours held", hours(report.cpu_seconds), report.cpu_seconds / 3600],
    [
      "cpu-used",
      "CPU-hours used",
      hours(report.used_cpu_seconds),
      report.used_cpu_seconds / 3600,
      `${pct(report.used_cpu_seconds, report.cpu_seconds)} of those held`,
    ],
    ["gpu", "GPU-hours", hours(report.gpu_seconds), report.gpu_seconds / 3600],
    ["memory", "Memory, GiB-hours", hours(report.memory_gib_seconds), report.memory_gib_seconds / 3600],
  ];
  return (
    <section class="card" aria-label="Totals">
      <dl class="stats" data-testid="usage-totals">
        {figures.map(([id, label, text, value, note]) => (
          <div key={id} data-testid="usage-total" data-name={id} data-value={value}>
            <dt>{label}</dt>
            <dd>
              {text}
              {note ? <span class="muted small"> {note}</span> : null}
            </dd>
          </div>
        ))}
      </dl>
    </section>
  );
}

/** One row per user or per job of a report: what it cost, held and used. */
function UsageTable({ report, by }: { report: UsageReport; by: "user" | "job" }) {
  if (!report.rows.length) {
    return <Empty>{by === "user" ? "No use in this window." : "No jobs held anything in this window."}</Empty>;
  }
  return (
    <div class="table-wrap">
      <table>
        <thead>
          <tr>
            <th scope="col">{by === "user" ? "User" : "Job"}</th>
            {by === "job" ? <th scope="col">Owner</th> : null}
            <th scope="col" class="num">
              Cost
            </th>
            <th scope="col" class="num">
              CPU-h held
            </th>
            <th scope="col" class="num">
              CPU-h used
            </th>
            <th scope="col" class="num">
              GPU-h
            </th>
            <th scope="col" class="num">
              Peak memory
            </th>
            <th scope="col" class="num" title="Attempts that held resources in the window">
              Attempts
            </th>
          </tr>
        </thead>
        <tbody>
          {report.rows.map((r) => (
            <tr
              key={r.key}
              data-testid={`usage-${by}-row`}
              data-user-id={by === "user" ? r.key : undefined}
              data-job-id={by === "job" ? r.key : undefined}
              data-cost={r.cost}
            >
              {by === "user" ? (
                <td title={r.key}>{r.name}</td>
              ) : (
                <td>
                  <Link href={`/jobs/${seg(r.key)}`} data-testid="usage-job-link">
                    {r.name}
                  </Link>
                  <div class="mono muted small">{r.key}</div>
                </td>
              )}
              {by === "job" ? (
                <td data-testid="usage-job-owner" title={r.org_name ?? r.org_id ?? ""}>
                  {r.user_name ?? r.user_id ?? "—"}
                </td>
              ) : null}
              <td class="num">{money(r.cost, report.currency)}</td>
              <td class="num">{hours(r.cpu_seconds)}</td>
              <td class="num" title={`${pct(r.used_cpu_seconds, r.cpu_seconds)} of those held`}>
                {hours(r.used_cpu_seconds)}
              </td>
              <td class="num">{hours(r.gpu_seconds)}</td>
              <td class="num">{r.peak_memory_bytes ? bytes(r.peak_memory_bytes) : "—"}</td>
              <td class="num">{r.attempts}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

const BUDGET_STATE: Record<string, [string, string]> = { ok: ["within", "ok"], soft: ["past soft", "warn"], hard: ["spent", "bad"] };

function BudgetTable({ budgets }: { budgets: Budget[] }) {
  if (!budgets.length) {
    return <Empty>No budgets apply. The platform admin sets an organisation's monthly budget (`kiln budgets set --org NAME --soft 80 --hard 100`), an organisation's admin its members' (`--user NAME`).</Empty>;
  }
  return (
    <div class="table-wrap">
      <table>
        <thead>
          <tr>
            <th scope="col">Applies to</th>
            <th scope="col" class="num">
              Used
            </th>
            <th scope="col" class="num">
              Soft limit
            </th>
            <th scope="col" class="num">
              Hard limit
            </th>
            <th scope="col">State</th>
            <th scope="col">Resets</th>
          </tr>
        </thead>
        <tbody>
          {budgets.map((b) => (
            <tr key={b.id} data-testid="budget-row" data-budget={b.id} data-state={b.state}>
              <td>
                {b.user_id ? (
                  <>
                    {b.user_name ?? b.user_id} <span class="muted small">of {b.org_name}</span>
                  </>
                ) : (
                  <>organisation {b.org_name}</>
                )}
                {b.stop_running ? <div class="muted small">stops running work when spent</div> : null}
              </td>
              <td class="num">{money(b.used, b.currency)}</td>
              <td class="num">{b.soft === null ? "—" : money(b.soft, b.currency)}</td>
              <td class="num">{b.hard === null ? "—" : money(b.hard, b.currency)}</td>
              <td>
                <span class={`badge tone-${(BUDGET_STATE[b.state] ?? [b.state, "muted"])[1]}`} data-testid="budget-state">
                  {(BUDGET_STATE[b.state] ?? [b.state])[0]}
                </span>
              </td>
              <td title={b.resets_at}>{time(b.resets_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

const RESOURCE: Record<string, string> = { cpu: "CPU-hour", memory_gib: "GiB-hour of memory", gpu: "GPU-hour" };

function PriceTable({ versions }: { versions: PriceVersion[] }) {
  const current = versions[versions.length - 1];
  if (!current) return <Empty>No prices set: every cost is 0.</Empty>;
  return (
    <>
      <p class="muted small">
        In force since {time(current.effective_from)}
        {versions.length > 1 ? ` (${versions.length - 1} earlier version${versions.length > 2 ? "s" : ""} price the use before it)` : ""}.
      </p>
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">Per</th>
              <th scope="col">Category</th>
              <th scope="col">GPU type</th>
              <th scope="col" class="num">
                Rate
              </th>
            </tr>
          </thead>
          <tbody>
            {current.rates.map((r) => (
              <tr key={`${r.category}/${r.resource}/${r.gpu_type}`} data-testid="price-row">
                <td>{RESOURCE[r.resource] ?? r.resource}</td>
                <td>{r.category === "*" ? "any" : r.category}</td>
                <td>{r.resource !== "gpu" ? "—" : r.gpu_type === "*" ? "any" : r.gpu_type}</td>
                <td class="num">{money(r.rate, current.currency)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}
