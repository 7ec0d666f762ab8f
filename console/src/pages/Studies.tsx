import { useMemo } from "preact/hooks";
import { post, seg } from "../api";
import { Chart, colour } from "../components/Chart";
import type { ChartLine } from "../components/Chart";
import { ParallelCoords } from "../components/ParallelCoords";
import { ActionButton, Empty, ErrorBox, KeyValues, Loading, Section, StateBadge } from "../components/ui";
import { ago, duration, num, time } from "../format";
import { useApi } from "../hooks";
import { Link } from "../router";
import { useAbilities } from "../session";
import type { Items, Study, Trial } from "../types";

export function Studies() {
  const { data, error } = useApi<Items<Study>>("/studies", { limit: 200 }, 5000);
  return (
    <div class="stack">
      <h1>Studies</h1>
      <ErrorBox error={error} />
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>No tuning studies. Start one with `kiln tune -f study.yaml` (docs/tuning.md).</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Study</th>
                <th scope="col">State</th>
                <th scope="col">Objective</th>
                <th scope="col">Trials</th>
                <th scope="col">Best</th>
                <th scope="col">Started</th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((s) => (
                <tr key={s.id} data-testid="study-row">
                  <td>
                    <Link href={`/studies/${seg(s.id)}`}>{s.name}</Link>
                    <div class="mono muted small">{s.id}</div>
                  </td>
                  <td>
                    <StateBadge state={s.state} />
                  </td>
                  <td>
                    {s.spec.objective.direction} {s.spec.objective.metric}
                  </td>
                  <td>
                    {s.trials.total} of {s.planned_trials}
                    <div class="muted small">
                      {s.trials.succeeded} ok · {s.trials.pruned} pruned · {s.trials.failed} failed · {s.trials.running} running
                    </div>
                  </td>
                  <td>{s.best ? `${num(s.best.value)} (#${s.best.number})` : "—"}</td>
                  <td>{ago(s.created_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

/** Best first: a trial's value in the objective's direction; trials without one after, newest first. */
export function byObjective(trials: Trial[], direction: "minimize" | "maximize"): Trial[] {
  const sign = direction === "maximize" ? -1 : 1;
  return [...trials].sort((a, b) => {
    if (a.value == null && b.value == null) return b.number - a.number;
    if (a.value == null) return 1;
    if (b.value == null) return -1;
    return sign * (a.value - b.value) || a.number - b.number;
  });
}

const PRUNED_GREY = "#9ca3af";

/** Why the pruner stopped a trial: "0.5 < 0.867 of 3 at step 5" (its value at the rung, the cutoff, how many others). */
export function pruneReason(t: Trial): string {
  const r = t.pruning;
  if (!r || r.value == null || r.cutoff == null) return "";
  const side = r.value < r.cutoff ? "<" : ">";
  const value = r.step != null && r.step !== r.rung ? `${num(r.value)} (step ${r.step})` : num(r.value);
  const cutoff = r.rule === "median" ? `median ${num(r.cutoff)}` : num(r.cutoff);
  return `${r.rule === "median" ? "best " : ""}${value} ${side} ${cutoff} of ${r.compared} at step ${r.rung}`;
}

export function StudyDetail({ id }: { id: string }) {
  const can = useAbilities();
  const study = useApi<Study>(`/studies/${seg(id)}`, undefined, (st) => (!st || st.state === "RUNNING" ? 4000 : false));
  const running = study.data?.state === "RUNNING";
  const trials = useApi<Items<Trial>>(`/studies/${seg(id)}/trials`, undefined, running ? 4000 : false);
  const s = study.data;
  const list = trials.data?.items ?? [];
  const sorted = useMemo(() => (s ? byObjective(list, s.spec.objective.direction) : []), [trials.data, s?.spec.objective.direction]);
  // Every trial with a value is drawn: a finished one at its objective value, a pruned one (greyed, a ring) at
  // the last value it reported before it was stopped; "best so far" is drawn from the finished ones only.
  const objective = useMemo(() => {
    if (!s) return { lines: [], pruned: 0 };
    const byNumber = [...list].sort((a, b) => a.number - b.number);
    const done = byNumber.filter((t) => t.value != null);
    const pruned = byNumber.filter((t) => t.state === "PRUNED" && t.value == null && t.last_value != null);
    let best: number | null = null;
    const better = (v: number) => best === null || (s.spec.objective.direction === "maximize" ? v > best : v < best);
    const bestSoFar = done.map((t) => {
      if (better(t.value as number)) best = t.value as number;
      return best;
    });
    const lines: ChartLine[] = [
      { label: s.spec.objective.metric, xs: done.map((t) => t.number), ys: done.map((t) => t.value as number), dots: true, colour: colour(0) },
      { label: "pruned (last value)", xs: pruned.map((t) => t.number), ys: pruned.map((t) => t.last_value as number), dots: true, hollow: true, colour: PRUNED_GREY },
      { label: "best so far", xs: done.map((t) => t.number), ys: bestSoFar, derived: true, colour: colour(1) },
    ];
    return { lines: lines.filter((l) => l.xs.length), pruned: pruned.length };
  }, [trials.data, s?.spec.objective.direction]);

  if (!s) return <div class="stack">{study.error ? <ErrorBox error={study.error} /> : <Loading />}</div>;
  const params = Object.keys(s.spec.parameters);
  return (
    <div class="stack" data-testid="study-detail">
      <div class="page-head">
        <div>
          <h1>
            {s.name} <StateBadge state={s.state} />
          </h1>
          <div class="mono muted small">{s.id}</div>
        </div>
        {can.write && running ? (
          <div class="actions">
            <ActionButton kind="danger" onClick={async () => (await post(`/studies/${seg(s.id)}/stop`), study.reload())} data-testid="stop-study">
              Stop study
            </ActionButton>
          </div>
        ) : null}
      </div>
      <Section title="Study" id="study-summary">
        <KeyValues
          rows={[
            ["Objective", `${s.spec.objective.direction} ${s.spec.objective.metric} (${s.spec.objective.aggregate ?? "last"} value)`],
            ["Algorithm", s.spec.algorithm],
            ["Trials", `${s.trials.total} of ${s.planned_trials} (${s.spec.parallelism} at once): ${s.trials.succeeded} succeeded, ${s.trials.pruned} pruned, ${s.trials.failed} failed, ${s.trials.running} running`],
            ["Best", s.best ? `${num(s.best.value)} — trial #${s.best.number}: ${Object.entries(s.best.params).map(([k, v]) => `${k}=${num(v as number)}`).join(", ")}` : "—"],
            ["Message", s.message || "—"],
            ["Started", time(s.created_at)],
          ]}
        />
      </Section>
      <ErrorBox error={trials.error} />
      <div class="two-col">
        <Section title="Objective over trials" id="study-objective">
          {objective.lines.length ? (
            <Chart
              title={s.spec.objective.metric}
              lines={objective.lines}
              xLabel="trial"
              testid="objective-chart"
              countLabel={(n) => `${n} ${n === 1 ? "trial" : "trials"}${objective.pruned ? `, ${objective.pruned} pruned` : ""}`}
            />
          ) : (
            <Empty>No trial has a value yet.</Empty>
          )}
        </Section>
        <Section title="Parameters" id="study-parcoords">
          {list.length ? <ParallelCoords study={s} trials={list} /> : <Empty>No trials yet.</Empty>}
        </Section>
      </div>
      <Section title="Trials, best first" id="study-trials">
        {!trials.data ? (
          <Loading />
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">#</th>
                  <th scope="col">State</th>
                  <th scope="col">{s.spec.objective.metric}</th>
                  {params.map((p) => (
                    <th scope="col" key={p}>
                      {p}
                    </th>
                  ))}
                  <th scope="col">Last step</th>
                  <th scope="col">Duration</th>
                  <th scope="col">Job</th>
                </tr>
              </thead>
              <tbody>
                {sorted.map((t) => (
                  <tr key={t.number} data-testid="trial-row" data-trial={t.number}>
                    <td>{t.number}</td>
                    <td>
                      <StateBadge state={t.state} />
                      {t.pruned_step != null ? <span class="muted small"> @{t.pruned_step}</span> : null}
                      {pruneReason(t) ? (
                        <div class="muted small" data-testid="prune-reason" title="its value at the rung, the cutoff it had to reach, how many other trials' values the cutoff came from">
                          {pruneReason(t)}
                        </div>
                      ) : null}
                    </td>
                    <td data-testid="trial-value">{num(t.value ?? null)}</td>
                    {params.map((p) => (
                      <td key={p}>{typeof t.params[p] === "number" ? num(t.params[p] as number) : String(t.params[p] ?? "—")}</td>
                    ))}
                    <td>{t.last_step != null ? `${t.last_step}: ${num(t.last_value ?? null)}` : "—"}</td>
                    <td>{duration(t.duration_seconds)}</td>
                    <td>{t.job_id ? <Link href={`/jobs/${seg(t.job_id)}`}>{t.job_id}</Link> : "—"}</td>
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
