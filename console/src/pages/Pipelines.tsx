// Pipelines: the runs (newest first) and the schedules; a run's steps drawn as its DAG (a layered layout: a step's
// column is one more than the longest path to it from a step with no dependencies), each node its state, a job
// step's node a link to its job, and the steps again as a table; cancel and resume.

import { useMemo } from "preact/hooks";
import { post, seg } from "../api";
import { ActionButton, Empty, ErrorBox, KeyValues, Loading, Section, StateBadge } from "../components/ui";
import { ago, duration, since, time } from "../format";
import { useApi } from "../hooks";
import { Link, navigate } from "../router";
import { useAbilities } from "../session";
import type { Items, PipelineRun, PipelineSchedule, PipelineStep } from "../types";

const RUN_POLL_MS = 1000;
const LIST_POLL_MS = 2000;
const ENDED = new Set(["SUCCEEDED", "CACHED", "FAILED", "SKIPPED", "CANCELLED"]);

/** "3/5": the steps that have ended (succeeded, cached, failed, skipped or cancelled) of all of them. */
function progress(run: PipelineRun): { text: string; detail: string } {
  const count: Record<string, number> = {};
  for (const s of run.steps) count[s.state] = (count[s.state] ?? 0) + 1;
  const ended = run.steps.filter((s) => ENDED.has(s.state)).length;
  const detail = Object.entries(count)
    .map(([state, n]) => `${n} ${state.toLowerCase()}`)
    .join(" · ");
  return { text: `${ended}/${run.steps.length}`, detail };
}

/** "in 4m10s" for a time to come, "2m ago" for one gone. */
function when(iso: string | null | undefined): string {
  if (!iso) return "—";
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  return seconds > 0 ? `in ${duration(seconds)}` : ago(iso);
}

export function Pipelines() {
  const runs = useApi<Items<PipelineRun>>("/pipelines/runs", { limit: 100 }, (d) =>
    d?.items.some((r) => r.state === "RUNNING") ? LIST_POLL_MS : false,
  );
  const schedules = useApi<Items<PipelineSchedule>>("/pipelines/schedules");
  return (
    <div class="stack">
      <h1>Pipelines</h1>
      <Section title="Runs" id="pipeline-runs">
        <ErrorBox error={runs.error} />
        {!runs.data ? (
          runs.error ? null : <Loading />
        ) : !runs.data.items.length ? (
          <Empty>No pipeline runs. Start one with `kiln pipelines run -f pipeline.yaml` (docs/pipelines.md).</Empty>
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Run</th>
                  <th scope="col">Pipeline</th>
                  <th scope="col">State</th>
                  <th scope="col">Steps done</th>
                  <th scope="col">Started</th>
                  <th scope="col">Duration</th>
                  <th scope="col">By</th>
                </tr>
              </thead>
              <tbody>
                {runs.data.items.map((r) => {
                  const p = progress(r);
                  return (
                    <tr key={r.id} data-testid="pipeline-run-row" data-run={r.id} data-state={r.state}>
                      <td class="mono">
                        <Link href={`/pipelines/${seg(r.id)}`}>{r.id}</Link>
                      </td>
                      <td>{r.name}</td>
                      <td>
                        <StateBadge state={r.state} />
                      </td>
                      <td title={p.detail} data-testid="pipeline-run-steps">
                        {p.text}
                      </td>
                      <td title={time(r.created_at)}>{ago(r.created_at)}</td>
                      <td>{since(r.created_at, r.finished_at)}</td>
                      <td>{r.user}</td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        )}
      </Section>
      <Section title="Schedules" id="pipeline-schedules">
        <ErrorBox error={schedules.error} />
        {!schedules.data ? (
          schedules.error ? null : <Loading />
        ) : !schedules.data.items.length ? (
          <Empty>No schedules. Add one with `kiln pipelines schedule -f pipeline.yaml --cron "0 3 * * *"`.</Empty>
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Pipeline</th>
                  <th scope="col">Cron (UTC)</th>
                  <th scope="col">Next run</th>
                  <th scope="col">Last run</th>
                  <th scope="col">Note</th>
                  <th scope="col">By</th>
                </tr>
              </thead>
              <tbody>
                {schedules.data.items.map((s) => (
                  <tr key={s.id} data-testid="schedule-row" data-schedule={s.id}>
                    <td>
                      {s.name}
                      <div class="mono muted small">{s.id}</div>
                    </td>
                    <td class="mono">{s.cron}</td>
                    <td title={time(s.next_at)}>{when(s.next_at)}</td>
                    <td>
                      {s.last_run_id ? <Link href={`/pipelines/${seg(s.last_run_id)}`}>{s.last_run_id}</Link> : "—"}
                      {s.last_at ? <div class="muted small">{time(s.last_at)}</div> : null}
                    </td>
                    <td>{s.message || "—"}</td>
                    <td>{s.user}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Section>
    </div>
  );
}

export interface Placed {
  step: PipelineStep;
  column: number;
  row: number;
  x: number;
  y: number;
}

export const NODE_W = 188;
export const NODE_H = 58;
const GAP_X = 72;
const GAP_Y = 18;
const PAD = 12;

/** Each step's column (1 + the longest path to it from a root over depends_on; a root is column 0) and its row
 * (its place among its column's steps, in the run's order), and where that puts it, columns centred vertically. */
export function layout(steps: PipelineStep[]): { nodes: Map<string, Placed>; width: number; height: number } {
  const byName = new Map(steps.map((s) => [s.name, s]));
  const column = new Map<string, number>();
  const columnOf = (name: string, seen: Set<string>): number => {
    const known = column.get(name);
    if (known !== undefined) return known;
    if (seen.has(name)) return 0; // a cycle (the server refuses them): drawn rather than looping
    seen.add(name);
    const deps = (byName.get(name)?.depends_on ?? []).filter((d) => byName.has(d));
    const c = deps.length ? 1 + Math.max(...deps.map((d) => columnOf(d, seen))) : 0;
    column.set(name, c);
    return c;
  };
  const columns: PipelineStep[][] = [];
  for (const s of steps) {
    const c = columnOf(s.name, new Set());
    (columns[c] ??= []).push(s);
  }
  const tallest = Math.max(1, ...columns.map((col) => col?.length ?? 0));
  const height = PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y;
  const nodes = new Map<string, Placed>();
  columns.forEach((col, c) => {
    if (!col) return;
    const colHeight = col.length * NODE_H + (col.length - 1) * GAP_Y;
    const top = (height - colHeight) / 2;
    col.forEach((step, row) => {
      nodes.set(step.name, { step, column: c, row, x: PAD + c * (NODE_W + GAP_X), y: top + row * (NODE_H + GAP_Y) });
    });
  });
  const width = PAD * 2 + columns.length * NODE_W + Math.max(0, columns.length - 1) * GAP_X;
  return { nodes, width, height };
}

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function openInPlace(href: string) {
  return (e: MouseEvent) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(href);
  };
}

function DagNode({ node }: { node: Placed }) {
  const { step, x, y } = node;
  const tip = `${step.name} (${step.kind}): ${step.state}${step.cached ? ", cached" : ""}${step.message ? ` — ${step.message}` : ""}`;
  const body = (
    <>
      <title>{tip}</title>
      <rect x={x} y={y} width={NODE_W} height={NODE_H} rx={7} class="dag-box" />
      <text x={x + 10} y={y + 21} class="dag-name">
        {clip(step.name, 22)}
      </text>
      <text x={x + 10} y={y + 42} class="dag-meta">
        {step.kind === "job" ? "job" : step.kind.replace("_", " ")} · {step.state.toLowerCase()}
        {step.tries > 1 ? ` · try ${step.tries}` : ""}
      </text>
      {step.cached ? (
        <text x={x + NODE_W - 10} y={y + 21} class="dag-cached" text-anchor="end" data-testid="dag-cached">
          cached
        </text>
      ) : null}
    </>
  );
  const href = step.job_id ? `/jobs/${seg(step.job_id)}` : null;
  return (
    <g class={`dag-node${step.cached ? " cached" : ""}`} data-testid="dag-node" data-step={step.name} data-state={step.state} data-kind={step.kind}>
      {href ? (
        <a href={href} onClick={openInPlace(href)} aria-label={`${step.name}: job ${step.job_id}`}>
          {body}
        </a>
      ) : (
        body
      )}
    </g>
  );
}

export function Dag({ steps }: { steps: PipelineStep[] }) {
  const { nodes, width, height } = useMemo(() => layout(steps), [steps]);
  const edges: { from: Placed; to: Placed }[] = [];
  for (const to of nodes.values()) {
    for (const dep of to.step.depends_on) {
      const from = nodes.get(dep);
      if (from) edges.push({ from, to });
    }
  }
  return (
    <div class="dag-wrap">
      <svg
        class="dag"
        width={width}
        height={height}
        viewBox={`0 0 ${width} ${height}`}
        role="img"
        aria-label={`The pipeline's ${steps.length} steps and their dependencies`}
        data-testid="pipeline-dag"
      >
        <defs>
          <marker id="dag-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
            <path d="M 0 0 L 10 5 L 0 10 z" class="dag-arrowhead" />
          </marker>
        </defs>
        {edges.map(({ from, to }) => {
          const x1 = from.x + NODE_W;
          const y1 = from.y + NODE_H / 2;
          const x2 = to.x;
          const y2 = to.y + NODE_H / 2;
          const dx = (x2 - x1) / 2;
          return (
            <path
              key={`${from.step.name}->${to.step.name}`}
              d={`M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2 - 1} ${y2}`}
              class="dag-edge"
              marker-end="url(#dag-arrow)"
              data-testid="dag-edge"
              data-from={from.step.name}
              data-to={to.step.name}
            />
          );
        })}
        {[...nodes.values()].map((node) => (
          <DagNode key={node.step.name} node={node} />
        ))}
      </svg>
    </div>
  );
}

export function PipelineRunDetail({ id }: { id: string }) {
  const can = useAbilities();
  const run = useApi<PipelineRun>(`/pipelines/runs/${seg(id)}`, undefined, (r) => (!r || r.state === "RUNNING" ? RUN_POLL_MS : false));
  const r = run.data;
  if (!r) return <div class="stack">{run.error ? <ErrorBox error={run.error} /> : <Loading />}</div>;
  const p = progress(r);
  const act = (what: "cancel" | "resume") => async () => {
    await post(`/pipelines/runs/${seg(r.id)}/${what}`);
    run.reload();
  };
  return (
    <div class="stack" data-testid="pipeline-run" data-state={r.state}>
      <div class="page-head">
        <div>
          <div class="muted small">
            <Link href="/pipelines">Pipelines</Link> /
          </div>
          <h1>
            {r.name} <StateBadge state={r.state} />
          </h1>
          <div class="mono muted small">{r.id}</div>
        </div>
        {can.write && (r.state === "RUNNING" || r.state === "FAILED" || r.state === "CANCELLED") ? (
          <div class="actions">
            {r.state === "RUNNING" ? (
              <ActionButton kind="danger" onClick={act("cancel")} data-testid="cancel-pipeline">
                Cancel
              </ActionButton>
            ) : (
              <ActionButton kind="primary" onClick={act("resume")} data-testid="resume-pipeline" title="Run its failed, skipped and cancelled steps again">
                Resume
              </ActionButton>
            )}
          </div>
        ) : null}
      </div>
      <ErrorBox error={run.error} />
      <Section title="Run" id="pipeline-summary">
        <KeyValues
          rows={[
            ["Steps", `${p.text} ended (${p.detail})`],
            ["Started", time(r.created_at)],
            ["Finished", r.finished_at ? `${time(r.finished_at)} (${since(r.created_at, r.finished_at)})` : "—"],
            ["By", r.user],
            ["Cache", r.use_cache ? "on" : "off"],
            ["Message", r.message || "—"],
          ]}
        />
      </Section>
      <Section title="Steps" id="pipeline-graph">
        {r.steps.length ? <Dag steps={r.steps} /> : <Empty>No steps.</Empty>}
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Step</th>
                <th scope="col">Kind</th>
                <th scope="col">State</th>
                <th scope="col">Depends on</th>
                <th scope="col">Job</th>
                <th scope="col">Tries</th>
                <th scope="col">Duration</th>
                <th scope="col">Message</th>
              </tr>
            </thead>
            <tbody>
              {r.steps.map((s) => (
                <tr key={s.name} data-testid="step-row" data-step={s.name} data-state={s.state}>
                  <td>{s.name}</td>
                  <td>{s.kind.replace("_", " ")}</td>
                  <td>
                    <StateBadge state={s.state} />
                    {s.cached && s.state !== "CACHED" ? <span class="muted small"> cached</span> : null}
                  </td>
                  <td>{s.depends_on.length ? s.depends_on.join(", ") : "—"}</td>
                  <td>{s.job_id ? <Link href={`/jobs/${seg(s.job_id)}`}>{s.job_id}</Link> : "—"}</td>
                  <td>{s.tries}</td>
                  <td>{s.started_at ? since(s.started_at, s.finished_at) : "—"}</td>
                  <td>{s.message || "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </Section>
    </div>
  );
}
