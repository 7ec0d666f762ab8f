// The jobs list: newest first, paged from the server with `before` (200 a page) as the user scrolls, drawn as a
// virtual list (only the rows in view are in the DOM), so 10,000 jobs scroll without all being loaded or drawn.
// Every 2 s the rows in view (and new jobs, at the top) are read again. State filters go to the server; user,
// name and label filters are applied here to what has been loaded, which keeps loading pages until the view is
// full (at most SCAN_PAGES pages a time: a rare name is then searched further on request).

import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { get, seg } from "../api";
import { ErrorBox, Field, StateBadge } from "../components/ui";
import { ago, bytes, cpus, since } from "../format";
import { useDebounced, useInterval } from "../hooks";
import { Link, navigate, setQuery, useLocation } from "../router";
import { useAbilities, useSession } from "../session";
import { JOB_STATES, isActive, type Items, type Job } from "../types";

const ROW = 44; // px, fixed: the virtual list computes positions from it
const PAGE = 200;
const OVERSCAN = 8;
const SCAN_PAGES = 10;
const POLL_MS = 2000;

interface Filters {
  states: string[];
  user: string;
  name: string;
  label: string;
}

function matches(job: Job, f: Filters, me: string | undefined): boolean {
  if (f.name && !`${job.name} ${job.id}`.toLowerCase().includes(f.name.toLowerCase())) return false;
  if (f.user) {
    const want = f.user.toLowerCase();
    const id = job.user_id.toLowerCase();
    const name = (job.user_name ?? "").toLowerCase();
    if (!(want === "me" ? job.user_id === me : id.includes(want) || name.includes(want))) return false;
  }
  if (f.label) {
    for (const term of f.label.split(",").map((t) => t.trim()).filter(Boolean)) {
      const [k, v] = term.split("=", 2).map((s) => s.trim());
      const have = job.spec.labels?.[k];
      if (have === undefined || (v !== undefined && have !== v)) return false;
    }
  }
  return true;
}

export function Jobs() {
  const { query } = useLocation();
  const can = useAbilities();
  const session = useSession();
  const filters: Filters = {
    states: (query.get("state") ?? "").split(",").filter(Boolean),
    user: query.get("user") ?? "",
    name: query.get("name") ?? "",
    label: query.get("label") ?? "",
  };
  const serverKey = filters.states.join(",");

  const [items, setItems] = useState<Job[]>([]);
  const [done, setDone] = useState(false);
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [scanned, setScanned] = useState(0); // pages loaded since the filters last changed
  const [scrollTop, setScrollTop] = useState(0);
  const [height, setHeight] = useState(600);
  const [selected, setSelected] = useState<string[]>([]);
  const scroller = useRef<HTMLDivElement>(null);
  const generation = useRef(0);

  const clientFilters = useDebounced({ user: filters.user, name: filters.name, label: filters.label }, 200);
  const visible = useMemo(
    () => items.filter((j) => matches(j, { ...filters, ...clientFilters }, session?.user.user_id)),
    [items, clientFilters.user, clientFilters.name, clientFilters.label, session?.user.user_id],
  );

  // A new server query (the state filter): start over.
  useEffect(() => {
    generation.current++;
    setItems([]);
    setDone(false);
    setScanned(0);
    setError(null);
    scroller.current?.scrollTo(0, 0);
  }, [serverKey]);
  useEffect(() => setScanned(0), [clientFilters.user, clientFilters.name, clientFilters.label]);

  const loadMore = useCallback(async () => {
    if (loading || done) return;
    const gen = generation.current;
    setLoading(true);
    try {
      const before = items.length ? items[items.length - 1].id : undefined;
      const page = await get<Items<Job>>("/jobs", { state: filters.states, limit: PAGE, before });
      if (gen !== generation.current) return;
      setItems((have) => {
        const known = new Set(have.map((j) => j.id));
        return [...have, ...page.items.filter((j) => !known.has(j.id))];
      });
      setDone(page.items.length < PAGE);
      setScanned((n) => n + 1);
      setError(null);
    } catch (err) {
      setError(err);
    } finally {
      setLoading(false);
    }
  }, [loading, done, items, serverKey]);

  // The window of rows in view.
  const first = Math.max(0, Math.floor(scrollTop / ROW) - OVERSCAN);
  const last = Math.min(visible.length, Math.ceil((scrollTop + height) / ROW) + OVERSCAN);
  // Near the end of what is loaded: the next page. Unfiltered, that follows the user's scrolling; with a filter
  // here that few loaded jobs match, the view may never fill: at most SCAN_PAGES pages, then on request.
  const clientFiltered = Boolean(clientFilters.user || clientFilters.name || clientFilters.label);
  const needMore = !done && !error && last >= visible.length - OVERSCAN && (!clientFiltered || scanned < SCAN_PAGES);
  useEffect(() => {
    if (needMore && !loading) void loadMore();
  }, [needMore, loading, visible.length]);

  // Keep what is in view fresh: the top page (new jobs too) or the window's own slice of the list.
  const inFlight = useRef(false);
  useInterval(() => {
    if (inFlight.current || !items.length) return;
    const gen = generation.current;
    const atTop = first === 0;
    const lo = atTop ? 0 : items.indexOf(visible[first]);
    const hi = items.indexOf(visible[Math.max(first, last - 1)]);
    if (lo < 0 || hi < 0) return;
    const limit = Math.min(500, Math.max(50, hi - lo + 1));
    const before = lo > 0 ? items[lo - 1].id : undefined;
    inFlight.current = true;
    get<Items<Job>>("/jobs", { state: filters.states, limit, before })
      .then((page) => {
        if (gen !== generation.current) return;
        setItems((have) => {
          const fresh = new Map(page.items.map((j) => [j.id, j]));
          const next = have.map((j) => fresh.get(j.id) ?? j);
          if (!before) {
            const known = new Set(have.map((j) => j.id));
            const newest = have[0]?.id ?? "";
            const added = page.items.filter((j) => !known.has(j.id) && j.id > newest);
            return [...added, ...next];
          }
          return next;
        });
      })
      .catch(() => undefined)
      .finally(() => {
        inFlight.current = false;
      });
  }, POLL_MS);

  useEffect(() => {
    const el = scroller.current;
    if (!el) return undefined;
    const ro = new ResizeObserver(() => setHeight(el.clientHeight));
    ro.observe(el);
    return () => ro.disconnect();
  }, []);

  const setFilter = (key: string, value: string) => setQuery({ [key]: value || null });
  const toggleState = (state: string) => {
    const next = filters.states.includes(state) ? filters.states.filter((s) => s !== state) : [...filters.states, state];
    setFilter("state", next.join(","));
  };
  const toggleSelected = (id: string) => setSelected((s) => (s.includes(id) ? s.filter((x) => x !== id) : [...s, id].slice(-50)));

  return (
    <div class="stack jobs-page">
      <div class="page-head">
        <h1>Jobs</h1>
        <div class="actions">
          {selected.length >= 2 ? (
            <button
              type="button"
              class="btn"
              data-testid="compare-selected"
              onClick={() => navigate(`/jobs/${seg(selected[0])}?tab=metrics&compare=${selected.slice(1).map(encodeURIComponent).join(",")}`)}
            >
              Compare metrics ({selected.length})
            </button>
          ) : null}
          {can.write ? (
            <Link href="/jobs/new" class="btn btn-primary" data-testid="new-job">
              Submit a job
            </Link>
          ) : null}
        </div>
      </div>

      <form class="filters card" role="search" aria-label="Filter jobs" onSubmit={(e) => e.preventDefault()}>
        <fieldset class="states">
          <legend>State</legend>
          {JOB_STATES.map((s) => (
            <label key={s} class="check">
              <input type="checkbox" checked={filters.states.includes(s)} onChange={() => toggleState(s)} data-testid={`filter-state-${s}`} />
              {s.toLowerCase()}
            </label>
          ))}
        </fieldset>
        <Field label="Name or id">
          <input type="search" value={filters.name} onInput={(e) => setFilter("name", e.currentTarget.value)} data-testid="filter-name" />
        </Field>
        <Field label="User">
          <input type="search" value={filters.user} placeholder="name, id or “me”" onInput={(e) => setFilter("user", e.currentTarget.value)} data-testid="filter-user" />
        </Field>
        <Field label="Label">
          <input type="search" value={filters.label} placeholder="key=value, …" onInput={(e) => setFilter("label", e.currentTarget.value)} data-testid="filter-label" />
        </Field>
      </form>

      <ErrorBox error={error} />
      <div class="job-table card" role="table" aria-label="Jobs" aria-rowcount={visible.length + 1}>
        <div class="job-row job-head" role="row">
          <span role="columnheader" class="c-sel">
            <span class="sr-only">Select</span>
          </span>
          <span role="columnheader" class="c-name">Job</span>
          <span role="columnheader" class="c-state">State</span>
          <span role="columnheader" class="c-user">User</span>
          <span role="columnheader" class="c-res">Resources</span>
          <span role="columnheader" class="c-labels">Labels</span>
          <span role="columnheader" class="c-time">Submitted</span>
          <span role="columnheader" class="c-dur">Ran</span>
        </div>
        <div class="job-scroll" ref={scroller} onScroll={(e) => setScrollTop(e.currentTarget.scrollTop)} data-testid="job-scroll">
          <div style={{ height: `${visible.length * ROW}px`, position: "relative" }} role="rowgroup">
            {visible.slice(first, last).map((job, i) => (
              <JobRow
                key={job.id}
                job={job}
                top={(first + i) * ROW}
                index={first + i + 2}
                selected={selected.includes(job.id)}
                onSelect={toggleSelected}
              />
            ))}
          </div>
        </div>
        <div class="job-foot muted small" aria-live="polite" data-testid="job-count">
          {visible.length.toLocaleString()} {clientFiltered ? `matching of ${items.length.toLocaleString()} loaded` : "loaded"}
          {done ? " (all)" : loading ? ", loading more…" : ", more on scroll"}
          {!done && !loading && clientFiltered && scanned >= SCAN_PAGES ? (
            <button type="button" class="btn btn-plain" onClick={() => setScanned(0)} data-testid="load-more">
              Search older jobs
            </button>
          ) : null}
        </div>
      </div>
    </div>
  );
}

function JobRow({ job, top, index, selected, onSelect }: { job: Job; top: number; index: number; selected: boolean; onSelect: (id: string) => void }) {
  const r = job.spec.resources;
  const workers = job.spec.distributed?.workers ?? 1;
  const labels = Object.entries(job.spec.labels ?? {});
  const ran = job.running_at ?? job.started_at;
  return (
    <div class="job-row" role="row" aria-rowindex={index} style={{ top: `${top}px` }} data-testid="job-row" data-job-id={job.id} data-state={job.state}>
      <span role="cell" class="c-sel">
        <input type="checkbox" checked={selected} onChange={() => onSelect(job.id)} aria-label={`Select ${job.name} for comparison`} />
      </span>
      <span role="cell" class="c-name">
        <Link href={`/jobs/${seg(job.id)}`} data-testid="job-link">
          {job.name}
        </Link>
        <span class="mono muted small"> {job.id}</span>
      </span>
      <span role="cell" class="c-state">
        <StateBadge state={job.state} />
      </span>
      <span role="cell" class="c-user" title={job.user_id}>
        {job.user_name ?? job.user_id}
      </span>
      <span role="cell" class="c-res small">
        {workers > 1 ? `${workers}× ` : ""}
        {cpus(r.cpus)} CPU{r.memory ? ` · ${bytes(r.memory)}` : ""}
        {r.gpus ? ` · ${r.gpus} GPU` : ""}
      </span>
      <span role="cell" class="c-labels small">
        {labels.slice(0, 3).map(([k, v]) => (
          <span class="chip" key={k}>
            {k}={v}
          </span>
        ))}
      </span>
      <span role="cell" class="c-time small" title={job.created_at}>
        {ago(job.created_at)}
      </span>
      <span role="cell" class="c-dur small">{ran ? since(ran, isActive(job.state) ? null : job.finished_at) : "—"}</span>
    </div>
  );
}
