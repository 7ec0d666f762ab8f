// A job's metric charts (or, with `system`, its CPU, memory and GPU series). The data is always the server's
// downsampled series (`downsample` = the chart's width in pixels; M4 + LTTB keep the shape, first, last, min and
// max), so a 1,000,000-point series costs the browser no more than a 1,000-point one. A drag on a step chart asks
// the server for that step range at the same resolution; other runs overlay through /metrics/compare.

import { useEffect, useMemo, useState } from "preact/hooks";
import { get, seg } from "../api";
import { Chart, type ChartLine } from "../components/Chart";
import { Empty, ErrorBox, Field, Loading, Section } from "../components/ui";
import { bytes, num } from "../format";
import { useApi, useDebounced, useVisible, useWidth } from "../hooks";
import { Link, setQuery, useLocation } from "../router";
import { isActive, type Items, type Job, type SeriesData, type SeriesSummary } from "../types";

const MIN_CHART = 420; // px: the grid puts as many charts side by side as fit
const GAP = 16;
const MAX_COMPARE = 49; // the server compares at most 50 jobs

/** step; seconds since each series began (runs compared side by side); or wall-clock time. */
type Axis = "step" | "relative" | "time";
const AXES: Record<Axis, string> = { step: "step", relative: "relative time", time: "wall time" };

const isSystem = (s: { name: string; source: string }) => s.source === "sys" || s.name.startsWith("system/");

/** Columns and each chart's width for a container this wide; the width, rounded to 50 px, is the downsample. */
export function layout(width: number): { columns: number; chartWidth: number; downsample: number } {
  const columns = Math.max(1, Math.floor((width + GAP) / (MIN_CHART + GAP)));
  const chartWidth = Math.max(200, Math.floor((width - GAP * (columns - 1)) / columns));
  return { columns, chartWidth, downsample: Math.min(20000, Math.max(50, Math.round(chartWidth / 50) * 50)) };
}

function value(v: unknown): number | null {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

export function JobMetrics({ job, system }: { job: Job; system: boolean }) {
  const { query } = useLocation();
  const compare = (query.get("compare") ?? "").split(",").filter((id) => id && id !== job.id).slice(0, MAX_COMPARE);
  const [axis, setAxis] = useState<Axis>(system ? "time" : "step");
  const [smoothing, setSmoothing] = useState(0);
  const [logScale, setLogScale] = useState(false);
  const [filter, setFilter] = useState("");
  const [zoom, setZoom] = useState<[number, number] | null>(null);
  const [measure, width] = useWidth<HTMLDivElement>();
  const { downsample } = layout(useDebounced(width, 200) || width);
  const active = isActive(job.state);

  const summary = useApi<{ series: SeriesSummary[] }>(`/jobs/${seg(job.id)}/metrics/summary`, undefined, active ? 5000 : false);
  const scalar = (summary.data?.series ?? []).filter((s) => s.kind === "scalar" && isSystem(s) === system);
  const text = system ? [] : (summary.data?.series ?? []).filter((s) => s.kind === "text");
  const allNames = [...new Set(scalar.map((s) => s.name))].sort();
  const f = filter.trim().toLowerCase();
  const names = f ? allNames.filter((n) => n.toLowerCase().includes(f)) : allNames;
  const stepRange = axis === "step" && zoom ? { step_min: Math.floor(zoom[0]), step_max: Math.ceil(zoom[1]) } : undefined;
  const jobNames = useJobNames([job, ...compare.map((id) => ({ id }))]);
  const workersSeen = new Set(scalar.map((x) => x.worker)).size;
  const setCompare = (ids: string[]) => setQuery({ compare: ids.length ? ids.join(",") : null });

  return (
    <div class="stack">
      <div class="card chart-card">
      <div class="chart-tools" role="toolbar" aria-label="Chart options">
        {!system ? (
          <fieldset class="segmented">
            <legend>X axis</legend>
            {(Object.keys(AXES) as Axis[]).map((a) => (
              <label key={a} class="check">
                <input type="radio" name="axis" value={a} checked={axis === a} onChange={() => (setAxis(a), setZoom(null))} data-testid={`axis-${a}`} /> {AXES[a]}
              </label>
            ))}
          </fieldset>
        ) : null}
        {!system ? (
          <label class="field inline">
            <span class="label">Smoothing {smoothing.toFixed(2)}</span>
            <input type="range" min="0" max="0.99" step="0.01" value={smoothing} onInput={(e) => setSmoothing(Number(e.currentTarget.value))} data-testid="smoothing" />
          </label>
        ) : null}
        <label class="check">
          <input type="checkbox" checked={logScale} onChange={(e) => setLogScale(e.currentTarget.checked)} data-testid="log-scale" /> Log scale
        </label>
        <label class="field inline">
          <span class="label">Metrics</span>
          <input type="search" value={filter} placeholder="filter by name" onInput={(e) => setFilter(e.currentTarget.value)} data-testid="metric-filter" />
        </label>
        {zoom ? (
          <button type="button" class="btn" onClick={() => setZoom(null)} data-testid="reset-zoom">
            Reset zoom (steps {Math.floor(zoom[0])}–{Math.ceil(zoom[1])})
          </button>
        ) : null}
      </div>
      {!system ? <ComparePicker job={job} compare={compare} onChange={setCompare} names={jobNames} /> : null}
      </div>
      <ErrorBox error={summary.error} />
      <div ref={measure} class="charts" style={{ gridTemplateColumns: `repeat(${layout(width).columns}, minmax(0, 1fr))` }} data-testid="charts" data-downsample={downsample}>
        {!summary.data ? (
          <Loading />
        ) : !allNames.length ? (
          <Empty>
            {system
              ? "No system metrics: set metrics.system: true in the job spec to record CPU, memory and GPU use."
              : "No metrics yet. Kiln reads lines like “step 10 loss=0.31” from the log, TensorBoard files and kiln.log()."}
          </Empty>
        ) : !width ? null : (
          names.map((name) => (
            <MetricChart
              key={name}
              name={name}
              jobIds={[job.id, ...compare]}
              jobNames={jobNames}
              several={workersSeen > 1}
              downsample={downsample}
              stepRange={stepRange}
              axis={axis}
              logScale={logScale}
              smoothing={system ? 0 : smoothing}
              poll={active ? 5000 : false}
              onZoom={setZoom}
            />
          ))
        )}
      </div>
      {text.length ? (
        <Section title="Text metrics" id="text-metrics">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Worker</th>
                <th scope="col">Last value</th>
                <th scope="col">Points</th>
              </tr>
            </thead>
            <tbody>
              {text.map((s) => (
                <tr key={`${s.name}/${s.worker}`}>
                  <td>{s.name}</td>
                  <td>{s.worker}</td>
                  <td>{num(s.last_value)}</td>
                  <td>{s.count}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </Section>
      ) : null}
    </div>
  );
}

/** Names of the jobs on the charts (the one shown is known; the compared ones are read once). */
function useJobNames(jobs: { id: string; name?: string }[]): Record<string, string> {
  const [names, setNames] = useState<Record<string, string>>({});
  const key = jobs.map((j) => j.id).join(",");
  useEffect(() => {
    let stop = false;
    const known: Record<string, string> = {};
    for (const j of jobs) if (j.name) known[j.id] = j.name;
    setNames((n) => ({ ...n, ...known }));
    for (const j of jobs.filter((x) => !x.name && !names[x.id])) {
      get<Job>(`/jobs/${seg(j.id)}`)
        .then((full) => !stop && setNames((n) => ({ ...n, [full.id]: full.name })))
        .catch(() => undefined);
    }
    return () => {
      stop = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key]);
  return names;
}

function ComparePicker({ job, compare, onChange, names }: { job: Job; compare: string[]; onChange: (ids: string[]) => void; names: Record<string, string> }) {
  const recent = useApi<Items<Job>>("/jobs", { limit: 100 });
  const [pick, setPick] = useState("");
  const options = (recent.data?.items ?? []).filter((j) => j.id !== job.id && !compare.includes(j.id));
  const add = (e: Event) => {
    e.preventDefault();
    const text = pick.trim();
    const byName = options.find((j) => j.name === text);
    const id = byName?.id ?? text.split(" ")[0];
    if (id && id !== job.id && !compare.includes(id)) onChange([...compare, id]);
    setPick("");
  };
  return (
    <form class="compare" onSubmit={add} aria-label="Compare with other runs" data-testid="compare">
      <Field label="Overlay another run" hint="a job id or name; the same metrics of each are drawn together">
        <input list="compare-jobs" value={pick} onInput={(e) => setPick(e.currentTarget.value)} data-testid="compare-input" />
      </Field>
      <datalist id="compare-jobs">
        {options.map((j) => (
          <option key={j.id} value={j.id}>
            {j.name}
          </option>
        ))}
      </datalist>
      <button type="submit" class="btn" disabled={!pick.trim() || compare.length >= MAX_COMPARE} data-testid="compare-add">
        Add
      </button>
      {compare.length ? (
        <ul class="chips" aria-label="Compared runs">
          {compare.map((id) => (
            <li key={id} class="chip">
              <Link href={`/jobs/${seg(id)}?tab=metrics`}>{names[id] ?? id}</Link>{" "}
              <button type="button" class="link" aria-label={`Stop comparing ${names[id] ?? id}`} onClick={() => onChange(compare.filter((c) => c !== id))}>
                ✕
              </button>
            </li>
          ))}
        </ul>
      ) : null}
    </form>
  );
}

interface ChartProps {
  name: string;
  jobIds: string[];
  jobNames: Record<string, string>;
  several: boolean; // more than one worker: name each line after its worker
  downsample: number;
  stepRange?: { step_min: number; step_max: number };
  axis: Axis;
  logScale: boolean;
  smoothing: number;
  poll: number | false;
  onZoom: (range: [number, number] | null) => void;
}

/** One metric's chart. It loads its series only once it scrolls into view (a job with 50 metrics asks for the
 * few on screen first) and refreshes it only while it is in view. */
function MetricChart(p: ChartProps) {
  const [ref, visible, seen] = useVisible<HTMLDivElement>();
  const compare = p.jobIds.length > 1;
  const query = { names: p.name, downsample: p.downsample, ...(p.stepRange ?? {}) };
  const single = useApi<{ series: SeriesData[] }>(seen && !compare ? `/jobs/${seg(p.jobIds[0])}/metrics` : null, query, visible && p.poll);
  const many = useApi<{ jobs: Record<string, SeriesData[]> }>(seen && compare ? "/metrics/compare" : null, { ...query, jobs: p.jobIds.join(",") }, visible && p.poll);
  const loaded = compare ? many : single;
  const byJob = useMemo<Record<string, SeriesData[]> | undefined>(
    () => (compare ? many.data?.jobs : single.data ? { [p.jobIds[0]]: single.data.series } : undefined),
    [compare, many.data, single.data],
  );
  const chart = useMemo(() => {
    if (!byJob) return null;
    const lines: ChartLine[] = [];
    let count = 0;
    let stepless = true;
    for (const [jobId, list] of Object.entries(byJob)) {
      for (const s of list.filter((x) => x.name === p.name && x.kind === "scalar")) {
        // A series without steps (system metrics) is drawn against time whatever the axis.
        const useStep = p.axis === "step" && s.points.some((pt) => pt[0] !== null);
        if (useStep) stepless = false;
        const pts = useStep ? s.points.filter((pt) => pt[0] !== null) : s.points;
        const t0 = p.axis === "relative" && pts.length ? pts[0][1] : 0; // the first point is always kept
        const who = compare ? (p.jobNames[jobId] ?? jobId) : "";
        const label = [who, p.several ? s.worker : ""].filter(Boolean).join(" · ") || p.name;
        lines.push({ label, xs: pts.map((pt) => (useStep ? (pt[0] as number) : pt[1] - t0)), ys: pts.map((pt) => value(pt[2])) });
        count += s.count;
      }
    }
    const relative = p.axis === "relative";
    return { lines, count, xTime: !relative && (p.axis === "time" || stepless), xLabel: relative ? "seconds" : p.axis === "step" && !stepless ? "step" : "time" };
  }, [byJob, p.axis, p.jobNames, p.several]);

  return (
    <div ref={ref} class="chart-slot">
      {chart ? (
        <Chart
          title={p.name}
          lines={chart.lines}
          count={chart.count}
          xTime={chart.xTime}
          xLabel={chart.xLabel}
          logScale={p.logScale}
          smoothing={p.smoothing}
          yFormat={p.name.endsWith("bytes") ? bytes : undefined}
          onZoom={chart.xLabel === "step" ? p.onZoom : undefined}
          testid="metric-chart"
        />
      ) : (
        <figure class="chart pending" data-testid="metric-chart-pending" data-metric={p.name}>
          <figcaption>
            <span class="chart-title">{p.name}</span>
          </figcaption>
          {loaded.error ? <ErrorBox error={loaded.error} /> : <Loading what="Loading" />}
        </figure>
      )}
    </div>
  );
}
