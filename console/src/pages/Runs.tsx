import { useEffect, useState } from "preact/hooks";
import { tracking } from "../api";
import { Chart, type ChartLine } from "../components/Chart";
import { Empty, ErrorBox, Loading, StateBadge } from "../components/ui";
import { Link, setQuery, useLocation } from "../router";

// Runs: every job is one (and so is every run logged with MLflow's client), read through the MLflow protocol Kiln
// serves at /mlflow. Filtering and sorting are the server's (MLflow's filter syntax; a column header sorts); the
// page's state is its URL (?experiment=&filter=&sort=&columns=), so a view can be shared.

interface KV {
  key: string;
  value: string;
}
interface RunInfo {
  run_id: string;
  run_name: string;
  status: string;
  user_id: string;
  start_time?: number;
}
interface Run {
  info: RunInfo;
  data: { params?: KV[]; tags?: KV[]; metrics?: { key: string; value: number }[] };
}
interface Experiment {
  experiment_id: string;
  name: string;
}

const STATUS_STATE: Record<string, string> = { FINISHED: "SUCCEEDED", KILLED: "CANCELLED", SCHEDULED: "QUEUED" };

function value(run: Run, column: string): string | number | undefined {
  const [kind, ...rest] = column.split(".");
  const key = rest.join(".");
  if (kind === "params") return run.data.params?.find((p) => p.key === key)?.value;
  if (kind === "metrics") return run.data.metrics?.find((m) => m.key === key)?.value;
  if (kind === "tags") return run.data.tags?.find((t) => t.key === key)?.value;
  return undefined;
}

function shown(v: string | number | undefined): string {
  if (v === undefined) return "-";
  return typeof v === "number" ? String(Number(v.toPrecision(6))) : v;
}

function defaultColumns(runs: Run[]): string[] {
  const params = new Set<string>();
  const metrics = new Set<string>();
  for (const run of runs) {
    run.data.params?.forEach((p) => params.add(p.key));
    run.data.metrics?.forEach((m) => !m.key.includes("/") && metrics.add(m.key));
  }
  return [...[...params].sort().slice(0, 4).map((k) => `params.${k}`), ...[...metrics].sort().slice(0, 4).map((k) => `metrics.${k}`)];
}

export function Runs() {
  const { query } = useLocation();
  const experiment = query.get("experiment") || "Default";
  const filter = query.get("filter") ?? "";
  const sort = query.get("sort") ?? "";
  const [draft, setDraft] = useState(filter);
  const [experiments, setExperiments] = useState<Experiment[]>([]);
  const [runs, setRuns] = useState<Run[] | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [picked, setPicked] = useState<string[]>([]);

  useEffect(() => {
    tracking<{ experiments?: Experiment[] }>("experiments/search", { max_results: 1000 })
      .then((answer) => setExperiments(answer.experiments ?? []))
      .catch(setError);
  }, []);

  useEffect(() => {
    const abort = new AbortController();
    setRuns(undefined);
    (async () => {
      try {
        const found = await tracking<{ experiment: Experiment }>("experiments/get-by-name", { experiment_name: experiment }, abort.signal);
        const order = sort ? [sort.startsWith("-") ? `${sort.slice(1)} DESC` : `${sort} ASC`] : [];
        const answer = await tracking<{ runs?: Run[] }>(
          "runs/search",
          { experiment_ids: found.experiment.experiment_id, filter, order_by: order, max_results: 500 },
          abort.signal,
        );
        setRuns(answer.runs ?? []);
        setError(undefined);
      } catch (err) {
        if (!(err instanceof DOMException)) setError(err);
      }
    })();
    return () => abort.abort();
  }, [experiment, filter, sort]);

  const columns = query.get("columns")?.split(",").filter(Boolean) ?? defaultColumns(runs ?? []);
  const [columnDraft, setColumnDraft] = useState<string | null>(null);
  const sortBy = (column: string) => setQuery({ sort: sort === `-${column}` ? column : `-${column}` });
  const chosen = (runs ?? []).filter((r) => picked.includes(r.info.run_id));

  return (
    <div class="stack">
      <h1>Runs</h1>
      <div class="card filter-bar">
        <label>
          Experiment{" "}
          <select data-testid="runs-experiment" value={experiment} onChange={(e) => setQuery({ experiment: (e.target as HTMLSelectElement).value, sort: null, filter: null, columns: null })}>
            {[...new Set([experiment, ...experiments.map((x) => x.name)])].map((name) => (
              <option key={name} value={name}>
                {name}
              </option>
            ))}
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
          <table data-testid="runs-table">
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
                    <StateBadge state={STATUS_STATE[run.info.status] ?? run.info.status} />
                  </td>
                  <td class="small">{run.info.user_id}</td>
                  {columns.map((column) => (
                    <td class="mono small" key={column}>
                      {shown(value(run, column))}
                    </td>
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {chosen.length >= 2 ? <Compare runs={chosen} /> : null}
    </div>
  );
}

const CHARTED = 4; // metrics drawn, each with every ticked run's line
const HISTORY = 5000; // points of each line

// The runs ticked in the table, side by side: the params that differ, every metric's last value, and the first
// metrics' histories with one line per run, overlaid.
function Compare({ runs }: { runs: Run[] }) {
  const params = [...new Set(runs.flatMap((r) => (r.data.params ?? []).map((p) => p.key)))].sort();
  const differ = params.filter((k) => new Set(runs.map((r) => value(r, `params.${k}`))).size > 1);
  const metrics = [...new Set(runs.flatMap((r) => (r.data.metrics ?? []).map((m) => m.key)))].sort();
  const ids = runs.map((r) => r.info.run_id).join(",");
  const [charts, setCharts] = useState<[string, ChartLine[]][]>([]);
  useEffect(() => {
    const abort = new AbortController();
    Promise.all(
      metrics.slice(0, CHARTED).map(async (key): Promise<[string, ChartLine[]]> => {
        const lines = await Promise.all(
          runs.map(async (run) => {
            const answer = await tracking<{ metrics?: { step: number; value: number }[] }>(
              "metrics/get-history",
              { run_id: run.info.run_id, metric_key: key, max_results: HISTORY },
              abort.signal,
            );
            const points = answer.metrics ?? [];
            return { label: run.info.run_name, xs: points.map((p) => p.step), ys: points.map((p) => p.value) };
          }),
        );
        return [key, lines];
      }),
    )
      .then(setCharts)
      .catch(() => setCharts([]));
    return () => abort.abort();
  }, [ids, metrics.join(",")]);
  return (
    <div class="card table-wrap" data-testid="runs-compare">
      <h2>Compare</h2>
      {charts.map(([key, lines]) => (
        <Chart key={key} title={key} lines={lines} xLabel="step" testid={`compare-chart-${key}`} />
      ))}
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
                <td class="mono small" key={r.info.run_id}>
                  {shown(value(r, row))}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
