// The Admin page's "Servers" tab (platform admins): which servers share the database, whether each is live, and
// the jobs and task leases each holds: GET /admin/servers, what `kiln admin servers` shows. Read again every 5 s:
// a server that stops renewing is seen going quiet, and its jobs moving to another once their leases run out.

import { Empty, ErrorBox, Loading, Section } from "../components/ui";
import { ago, duration, time } from "../format";
import { useApi } from "../hooks";
import { Link } from "../router";
import type { ServerList, ServerRow } from "../types";

const REFRESH_MS = 5000;

export function Servers() {
  const servers = useApi<ServerList>("/admin/servers", undefined, REFRESH_MS);
  return (
    <Section title="Servers" id="servers">
      <p class="muted small">
        Each server records itself every heartbeat. A job held by a server that is no longer live waits for its lease to run out; another server then takes it over, and the job's events say so
        (TakenOver).
      </p>
      <ErrorBox error={servers.error} />
      {!servers.data ? (
        servers.error ? null : <Loading />
      ) : !servers.data.items.length ? (
        <Empty>No server has recorded itself yet.</Empty>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Server</th>
                <th scope="col">Host</th>
                <th scope="col">PID</th>
                <th scope="col">Version</th>
                <th scope="col">Started</th>
                <th scope="col">Last heartbeat</th>
                <th scope="col">Live</th>
                <th scope="col">Jobs held</th>
                <th scope="col">Task leases</th>
              </tr>
            </thead>
            <tbody>
              {servers.data.items.map((s) => (
                <ServerLine key={s.id} server={s} now={servers.data!.now} />
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Section>
  );
}

function ServerLine({ server: s, now }: { server: ServerRow; now: string }) {
  const left = s.live_until ? (Date.parse(s.live_until) - Date.parse(now)) / 1000 : null;
  return (
    <tr data-testid="server-row" data-server={s.id} data-live={String(s.live)}>
      <td class="mono">
        {s.id}
        {s.endpoint ? <div class="muted small">{s.endpoint}</div> : null}
      </td>
      <td>{s.host ?? "—"}</td>
      <td class="mono">{s.pid ?? "—"}</td>
      <td class="mono small">{s.version ?? "—"}</td>
      <td title={s.started_at ?? undefined}>{s.started_at ? time(s.started_at) : "—"}</td>
      <td title={s.seen_at ?? undefined}>{s.seen_at ? ago(s.seen_at) : "—"}</td>
      <td data-testid="server-live">
        <span class={`badge tone-${s.live ? "ok" : "bad"}`}>{s.live ? "live" : "not live"}</span>
        {left !== null ? <div class="muted small">{left >= 0 ? `${duration(left)} left` : `quiet for ${duration(-left)}`}</div> : null}
      </td>
      <td data-testid="server-jobs" data-count={s.jobs}>
        {s.jobs}
        {s.job_ids.length ? (
          <ul class="holders small">
            {s.job_ids.map((id) => (
              <li key={id}>
                <Link href={`/jobs/${encodeURIComponent(id)}`} class="mono">
                  {id}
                </Link>
              </li>
            ))}
          </ul>
        ) : null}
      </td>
      <td data-testid="server-leases">{s.task_leases.length ? s.task_leases.join(", ") : "—"}</td>
    </tr>
  );
}
