import { post, seg } from "../api";
import { ActionButton, KeyValues, Section } from "../components/ui";
import { num, time } from "../format";
import type { Service } from "../types";

type Version = Service["versions"][number];

const percent = (rate: number | null | undefined): string => (rate == null ? "—" : `${num(rate * 100)} %`);
const ms = (value: number | null | undefined): string => (value == null ? "—" : `${num(value)} ms`);

/** Which share of the predicts naming no version a version gets: the canary its weight, the stable the rest. */
function share(s: Service, v: Version): string {
  if (v.role === "canary") return `${s.canary?.weight ?? 0} %`;
  if (v.role === "stable") return `${100 - (s.canary?.weight ?? 0)} %`;
  if (v.role === "shadow") return "a copy of each";
  return "—";
}

/** The service's model versions side by side (stable, canary, shadow): each one's share and figures, the canary's
 * policy and moves, the shadow's comparison; promote and rollback for a writer while a canary runs. */
export function ServiceTraffic({ service: s, canWrite, onDone }: { service: Service; canWrite: boolean; onDone: () => void }) {
  if (!s.canary && !s.shadow && s.versions.length < 2) return null;
  const policy = s.canary?.policy;
  const actions =
    canWrite && s.canary ? (
      <>
        <ActionButton kind="primary" data-testid="canary-promote" onClick={async () => { await post(`/services/${seg(s.name)}/promote`); onDone(); }}>
          Promote canary
        </ActionButton>
        <ActionButton kind="danger" data-testid="canary-rollback" onClick={async () => { await post(`/services/${seg(s.name)}/rollback`); onDone(); }}>
          Roll back canary
        </ActionButton>
      </>
    ) : null;
  return (
    <Section title="Traffic by model version" id="service-traffic" actions={actions}>
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">Version</th>
              <th scope="col">Role</th>
              <th scope="col">Share</th>
              <th scope="col">Requests</th>
              <th scope="col">Errors</th>
              <th scope="col">Req/s</th>
              <th scope="col">p50</th>
              <th scope="col">p99</th>
            </tr>
          </thead>
          <tbody>
            {s.versions.map((v) => (
              <tr key={`${v.role}-${v.model_version}`} data-testid="version-row" data-role={v.role}>
                <td>
                  {s.model_name}@{v.model_version}
                </td>
                <td>{v.role}</td>
                <td>{share(s, v)}</td>
                <td>{v.requests}</td>
                <td>
                  {v.errors} <span class="muted small">{percent(v.error_rate)}</span>
                </td>
                <td>{num(v.requests_per_second)}</td>
                <td>{ms(v.latency_ms_p50)}</td>
                <td>{ms(v.latency_ms_p99)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {s.canary ? (
        <KeyValues
          rows={[
            ["Canary", `${s.model_name}@${s.canary.model_version}: ${s.canary.weight} % of the predicts, ${s.canary.replicas} replica(s)`],
            [
              "Rollout policy",
              policy
                ? `steps ${policy.steps.length ? policy.steps.join(" → ") : "none"} (every ${num(policy.step_wait)} s); roll back above ${percent(policy.max_error_rate)} errors or p99 ${ms(policy.max_p99_ms)}, judged on ${policy.min_requests}+ predicts`
                : "moved by hand",
            ],
            ["Share since", time(s.canary.step_at)],
          ]}
        />
      ) : null}
      {s.shadow ? (
        <KeyValues
          rows={[
            ["Shadow", `${s.model_name}@${s.shadow.model_version}: answers compared, never returned`],
            ["Copies", `${s.shadow.copied} sent, ${s.shadow.dropped} dropped, ${s.shadow.errors} errors`],
            ["Agreement", `${percent(s.shadow.agreement_rate)} of ${s.shadow.compared} outputs; mean |diff| ${num(s.shadow.mean_abs_diff)}`],
            ["Shadow latency", `p50 ${ms(s.shadow.latency_ms_p50)}, p99 ${ms(s.shadow.latency_ms_p99)}`],
          ]}
        />
      ) : null}
      {s.rollout_events.length ? (
        <ol class="small" data-testid="rollout-events">
          {s.rollout_events.map((e) => (
            <li key={`${e.at}-${e.move}`}>
              {time(e.at)}: {s.model_name}@{e.version} {e.move.replace("_", " ")} at {e.weight} % by {e.by}
              {e.message ? ` — ${e.message}` : ""}
            </li>
          ))}
        </ol>
      ) : null}
    </Section>
  );
}
