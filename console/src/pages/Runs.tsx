import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { get, tracking } from "../api";
import { Chart, type ChartLine } from "../components/Chart";
import { Empty, ErrorBox, Loading, StateBadge } from "../components/ui";
import { useWidth } from "../hooks";
import { Link, setQuery, useLocation } from "../router";
import { defaultColumns, formatValue, fullValue, runState, value, type Run } from "../runTable";
import type { ExperimentRow, SeriesData } from "../types";

// Runs: every job is one (and so is every run logged with MLflow's client), read through the MLflow protocol Kiln
// serves at /mlflow. Filtering and sorting are the server's (MLflow's filter syntax; a column header sorts); the
// page's state is its URL (?experiment=&filter=&sort=&columns=&compare=), so a view can be shared, the runs
// compared included. The experiment picker is the experiment list (GET /api/v1/experiments: each with its run
// count); what the table shows by default, its states' names and its numbers' rounding are runTable.ts's, the
// CLI's rules.

interface Experiment {
  experiment_id: string;
  name: string;
}

// Rows a search asks for: the first ones show at once (a 10,000-run experiment of 50 params each sends 100 runs'
// params, not 500's), more on request, as MLflow's UI loads them.
const PAGE = 100;

// What a search sends of each run: the columns shown only (Kiln's `columns` of runs/search), not every param and
// metric of runs that may have hundreds; the first search of an experiment and filter without ?columns= asks the
// server to choose them (`default_columns`: runTable.ts's rule, counted in SQL) and keeps them for a re-sort and
// for more rows. The comparison below asks for its runs whole.
type Answer = { runs?: Run[]; next_page_token?: string; columns?: string[] };

/** The columns the page's address asks for (?columns=a,b), null for none. */
function shownColumns(text: string | null): string[] | null {
  const columns = (text ?? "").split(",").filter(Boolean);
  return columns.length ? columns : null;
}

/** A page's runs/search: public/early.js builds the same query, key by key in this order, for the page's address. */
export function searchQuery(experiment: string, filter: string, sort: string, columns: string[] | null) {
  const order = sort ? [sort.startsWith("-") ? `${sort.slice(1)} DESC` : `${sort} ASC`] : [];
  const shown = columns ? { columns } : { default_columns: "true" };
  return { experiment_names: experiment, filter, order_by: order, max_results: PAGE, ...shown };
}

/** A cell: the value rounded for reading, every digit in its title (on hover). */
function Cell({ v }: { v: string | number | undefined }) {
  return (
    <td class="mono small" title={fullValue(v)}>
      {formatValue(v)}
    </td>
  );
}

export function Runs() {
  const { query } = useLocation();
  const experiment = query.get("experiment") || "Default";
  const filter = query.get("filter") ?? "";
  const sort = query.get("sort") ?? "";
  const [draft, setDraft] = useState(filter);
  const [experiments, setExperiments] = useState<ExperimentRow[]>([]);
  const [runs, setRuns] = useState<Run[] | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const picked = (query.get("compare") ?? "").split(",").filter(Boolean);
  const setPicked = (ids: string[]) => setQuery({ compare: ids.length ? ids.join(",") : null });

  // An MLflow link names the experiment by id (mlflowLinks.ts): the page's address names it by name.
  const experimentId = query.get("experiment_id");
  useEffect(() => {
    if (!experimentId) return;
    tracking<{ experiment: Experiment }>("experiments/get", { experiment_id: experimentId })
      .then((answer) => setQuery({ experiment: answer.experiment.name, experiment_id: null }))
      .catch(setError);
  }, [experimentId]);

  useEffect(() => {
    get<{ items: ExperimentRow[] }>("/experiments")
      .then((answer) => setExperiments(answer.items))
      .catch(setError);
  }, []);

  // The experiment is searched by its name (Kiln's experiment_names): the first search needs no look-up first, and
  // public/early.js sends it while the bundle loads (the same GET: searchQuery).
  const [more, setMore] = useState<string | null>(null); // the next page's token
  const [busy, setBusy] = useState(false);
  const asked = shownColumns(query.get("columns"));
  // The columns the server chose, for the experiment and filter they were chosen for.
  const [chosen, setChosen] = useState<{ key: string; columns: string[] } | null>(null);
  const viewKey = `${experiment}\n${filter}`;
  const search = async (experimentName: string, token: string | null, signal: AbortSignal) => {
    const keep = asked ?? (chosen?.key === viewKey ? chosen.columns : null);
    const query = { ...searchQuery(experimentName, filter, sort, keep), ...(token ? { page_token: token } : {}) };
    const answer = await tracking<Answer>("runs/search", query, signal);
    if (answer.columns) setChosen({ key: viewKey, columns: answer.columns });
    return answer;
  };

  useEffect(() => {
    if (experimentId) return; // the name comes first (above)
    const abort = new AbortController();
    setBusy(true); // a new sort or filter keeps the rows shown until the new ones come
    (async () => {
      try {
        const answer = await search(experiment, null, abort.signal);
        let found = answer.runs ?? [];
        // Runs picked for comparison (a shared link) that are not among the first rows: asked by id.
        const missing = picked.filter((id) => !found.some((r) => r.info.run_id === id));
        if (missing.length && !filter) {
          const list = missing.map((id) => `'${id.replace(/'/g, "")}'`).join(", ");
          const columns = asked ?? answer.columns ?? (chosen?.key === viewKey ? chosen.columns : []);
          const extra = await tracking<Answer>("runs/search", { experiment_names: experiment, filter: `attributes.run_id IN (${list})`, max_results: PAGE, columns: columns.length ? columns : "attributes.run_id" }, abort.signal);
          found = [...found, ...(extra.runs ?? [])];
        }
        setRuns(found);
        setMore(answer.next_page_token ?? null);
        setError(undefined);
      } catch (err) {
        if (!(err instanceof DOMException)) setError(err);
      } finally {
        if (!abort.signal.aborted) setBusy(false);
      }
    })();
    return () => abort.abort();
  }, [experiment, experimentId, filter, sort]);

  const loadMore = async () => {
    if (!more) return;
    setBusy(true);
    try {
      const answer = await search(experiment, more, new AbortController().signal);
      const known = new Set((runs ?? []).map((r) => r.info.run_id));
      setRuns([...(runs ?? []), ...(answer.runs ?? []).filter((r) => !known.has(r.info.run_id))]);
      setMore(answer.next_page_token ?? null);
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };

  useEffect(() => {
    if (runs?.length) performance.mark("kiln:runs-rows"); // drawn: benchmarks/runs_page.py times it
  }, [runs]);

  const columns = asked ?? (chosen?.key === viewKey ? chosen.columns : defaultColumns(runs ?? []));
  const [columnDraft, setColumnDraft] = useState<string | null>(null);
  const sortBy = (column: string) => setQuery({ sort: sort === `-${column}` ? column : `-${column}` });
  const compared = (runs ?? []).filter((r) => picked.includes(r.info.run_id));

  return (
    <div class="stack">
      <h1>Runs</h1>
      <div class="card filter-bar">
        <label>
          Experiment{" "}
          <select
            data-testid="runs-experiment"
            value={experiment}
            onChange={(e) => {
              setRuns(undefined); // another experiment's rows are not these
              setQuery({ experiment: (e.target as HTMLSelectElement).value, sort: null, filter: null, columns: null, compare: null });
            }}
          >
            {[...new Set([experiment, ...experiments.map((x) => x.name)])].map((name) => {
              const found = experiments.find((x) => x.name === name);
              return (
                <option key={name} value={name}>
                  {found ? `${name} (${found.run_count.toLocaleString()} run${found.run_count === 1 ? "" : "s"})` : name}
                </option>
              );
            })}
          </select>
        </label>
        <form
          onSubmit={(e) => {
            e.preventDefault();
            setQuery({ filter: draft });
          }}
        >
          <input class="mono" data-testid="runs-filter" placeholder="params.lr < 0.1 and metrics.val_acc > 0.9" value={draft} onInput={(e) => setDraft((e.target as HTMLInputElement).value)} />
          <button type="submit" class="btn">Filter</button>
        </form>
        <form
          onSubmit={(e) => {
            e.preventDefault();
            setQuery({ columns: (columnDraft ?? columns.join(",")).replace(/\s+/g, "") });
          }}
        >
          <input
            class="mono"
            aria-label="Columns"
            data-testid="runs-columns"
            title="params.X, metrics.X or tags.X, comma-separated"
            value={columnDraft ?? columns.join(",")}
            onInput={(e) => setColumnDraft((e.target as HTMLInputElement).value)}
          />
          <button type="submit" class="btn">Columns</button>
        </form>
      </div>
      <ErrorBox error={error} />
      {!runs ? (
        <Loading />
      ) : !runs.length ? (
        <Empty>No runs here. Every job is a run (`kiln run --experiment NAME --param lr=0.01`), and MLflow's client logs runs too.</Empty>
      ) : (
        <div class="card table-wrap">
          <table data-testid="runs-table" aria-busy={busy}>
            <thead>
              <tr>
                <th scope="col"></th>
                <th scope="col">Run</th>
                <th scope="col">Status</th>
                <th scope="col">User</th>
                {columns.map((column) => (
                  <th scope="col" key={column}>
                    <button class="link" data-testid={`sort-${column}`} onClick={() => sortBy(column)}>
                      {column}
                      {sort === column ? " ▲" : sort === `-${column}` ? " ▼" : ""}
                    </button>
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {runs.map((run) => (
                <tr key={run.info.run_id} data-testid="run-row" data-run={run.info.run_id}>
                  <td>
                    <input
                      type="checkbox"
                      aria-label={`compare ${run.info.run_name}`}
                      checked={picked.includes(run.info.run_id)}
                      onChange={(e) => setPicked((e.target as HTMLInputElement).checked ? [...picked, run.info.run_id] : picked.filter((id) => id !== run.info.run_id))}
                    />
                  </td>
                  <td>{run.info.run_id.startsWith("job-") ? <Link href={`/jobs/${run.info.run_id}`}>{run.info.run_name}</Link> : run.info.run_name}</td>
                  <td>
                    <StateBadge state={runState(run)} />
                  </td>
                  <td class="small">{run.info.user_id}</td>
                  {columns.map((column) => (
                    <Cell key={column} v={value(run, column)} />
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
          {more ? (
            <button class="btn" data-testid="runs-more" disabled={busy} onClick={loadMore}>
              Show {PAGE} more
            </button>
          ) : null}
        </div>
      )}
      {compared.length >= 2 ? <Compare runs={compared} experiment={experiment} /> : null}
    </div>
  );
}

/** The runs compared with every param, tag and metric (the table's rows carry its columns only): asked by id,
 * the table's rows shown until they come. */
function useWhole(shown: Run[], experiment: string): Run[] {
  const key = shown.map((r) => r.info.run_id).join(",");
  const [whole, setWhole] = useState<{ key: string; runs: Run[] } | null>(null);
  useEffect(() => {
    const abort = new AbortController();
    const list = shown.map((r) => `'${r.info.run_id.replace(/'/g, "")}'`).join(", ");
    tracking<Answer>("runs/search", { experiment_names: experiment, filter: `attributes.run_id IN (${list})`, max_results: PAGE }, abort.signal)
      .then((answer) => {
        const found = new Map((answer.runs ?? []).map((r) => [r.info.run_id, r]));
        setWhole({ key, runs: shown.map((r) => found.get(r.info.run_id) ?? r) });
      })
      .catch(() => undefined); // the table's rows stay: a comparison of the columns shown
    return () => abort.abort();
  }, [key, experiment]);
  return whole?.key === key ? whole.runs : shown;
}

const CHARTED = 4; // metrics drawn, each with every ticked run's line

/** Points of each line: about one a pixel of the chart's width (the server downsamples, keeping the shape), at
 * most 1,000: with several runs' lines overlaid, more would not show, and cost the server more. */
function downsampleFor(width: number): number {
  return Math.min(1000, Math.max(200, Math.round(width / 50) * 50));
}

/** The downsample for a chart this wide, kept while the width stays within a quarter of the one it was chosen
 * for: a scroll bar coming or going does not ask for every series again. 0 until the width is known. */
function useDownsample(width: number): number {
  const chosenFor = useRef(0);
  if (width > 0 && (!chosenFor.current || Math.abs(width - chosenFor.current) > chosenFor.current / 4)) chosenFor.current = width;
  return chosenFor.current ? downsampleFor(chosenFor.current) : 0;
}

const finite = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** One chart's lines: a line per run (and per worker, where a run has several), by step where its points have
 * one, else by seconds since its first point. */
function linesOf(key: string, runs: Run[], data: Record<string, SeriesData[]>): ChartLine[] {
  const lines: ChartLine[] = [];
  for (const run of runs) {
    const series = (data[run.info.run_id] ?? []).filter((s) => s.name === key && s.kind === "scalar");
    for (const s of series) {
      const stepped = s.points.filter((pt) => pt[0] !== null);
      const pts = stepped.length ? stepped : s.points;
      const t0 = pts.length ? pts[0][1] : 0;
      lines.push({
        label: series.length > 1 ? `${run.info.run_name} · ${s.worker}` : run.info.run_name,
        xs: pts.map((pt) => (stepped.length ? (pt[0] as number) : pt[1] - t0)),
        ys: pts.map((pt) => finite(pt[2])),
      });
    }
  }
  return lines;
}

// The runs ticked in the table, side by side: the params that differ, every metric's last value, and the first
// metrics' series with one line per run, overlaid: one request for every run and metric (GET /runs/metrics), each
// series downsampled by the server to about the chart's width, so runs of a million points each load at once.
function Compare({ runs: shown, experiment }: { runs: Run[]; experiment: string }) {
  const runs = useWhole(shown, experiment);
  const params = [...new Set(runs.flatMap((r) => (r.data.params ?? []).map((p) => p.key)))].sort();
  const differ = params.filter((k) => new Set(runs.map((r) => value(r, `params.${k}`))).size > 1);
  const metrics = [...new Set(runs.flatMap((r) => (r.data.metrics ?? []).map((m) => m.key)))].sort();
  const charted = metrics.slice(0, CHARTED);
  const ids = runs.map((r) => r.info.run_id);
  const [measure, width] = useWidth<HTMLDivElement>();
  const downsample = useDownsample(width);
  const [data, setData] = useState<Record<string, SeriesData[]> | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  useEffect(() => {
    if (!downsample || !charted.length) return undefined;
    const abort = new AbortController();
    get<{ runs: Record<string, SeriesData[]> }>("/runs/metrics", { run: ids, name: charted, downsample }, abort.signal)
      .then((answer) => {
        setData(answer.runs);
        setError(undefined);
      })
      .catch((err) => !abort.signal.aborted && setError(err));
    return () => abort.abort();
  }, [ids.join(","), charted.join(","), downsample]);
  const charts = useMemo(
    () =>
      data
        ? charted.map((key) => {
            const count = runs.reduce((n, r) => n + (data[r.info.run_id] ?? []).filter((s) => s.name === key).reduce((m, s) => m + s.count, 0), 0);
            return { key, lines: linesOf(key, runs, data), count };
          })
        : undefined,
    [data, ids.join(","), charted.join(",")],
  );
  return (
    <div ref={measure} class="card table-wrap" data-testid="runs-compare" data-downsample={downsample}>
      <h2>Compare</h2>
      <ErrorBox error={error} />
      {charts ? (
        charts.map(({ key, lines, count }) => (
          <Chart key={key} title={key} lines={lines} count={count} xLabel="step" testid={`compare-chart-${key}`} mark="kiln:compare-chart" />
        ))
      ) : charted.length && !error ? (
        <Loading />
      ) : null}
      <table>
        <thead>
          <tr>
            <th scope="col"></th>
            {runs.map((r) => (
              <th scope="col" key={r.info.run_id}>
                {r.info.run_name}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {[...differ.map((k) => `params.${k}`), ...metrics.map((k) => `metrics.${k}`)].map((row) => (
            <tr key={row}>
              <th scope="row" class="mono small">
                {row}
              </th>
              {runs.map((r) => (
                <Cell key={r.info.run_id} v={value(r, row)} />
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
