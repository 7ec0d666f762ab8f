import { useEffect, useState } from "preact/hooks";
import { get, seg } from "../api";
import { ErrorBox, Empty, Loading, Meter, Section, StateBadge } from "../components/ui";
import { bytes, cpus, ago } from "../format";
import { useApi } from "../hooks";
import { Link } from "../router";
import type { InventoryNode, Items, Job, QuotaReport, Why } from "../types";

export function Overview() {
  return (
    <div class="stack">
      <h1>Overview</h1>
      <Inventory />
      <Queue />
      <Quota />
    </div>
  );
}

function Inventory() {
  const { data, error } = useApi<Items<InventoryNode>>("/nodes", undefined, 5000);
  const nodes = data?.items;
  return (
    <Section title="Machines" id="inventory">
      <ErrorBox error={error} />
      {!nodes ? (
        <Loading />
      ) : nodes.length === 0 ? (
        <Empty>No nodes.</Empty>
      ) : (
        <div class="nodes">
          {nodes.map((node) => (
            <article class="node" key={node.name} data-testid="node" data-node={node.name}>
              <h3>{node.name}</h3>
              <div class="node-meters">
                <div>
                  <span class="label">CPUs</span>
                  <Meter label={`${node.name} CPUs`} used={node.allocated_cpus} limit={node.cpus} format={cpus} />
                </div>
                <div>
                  <span class="label">Memory</span>
                  <Meter label={`${node.name} memory`} used={node.allocated_memory} limit={node.memory} format={bytes} />
                </div>
              </div>
              {node.gpus.length ? (
                <ul class="gpus" aria-label={`${node.name} GPUs`}>
                  {node.gpus.map((g) => (
                    <li key={g.index} class={g.job_id || g.other_org ? "gpu busy" : "gpu"} data-testid="gpu">
                      <strong>GPU {g.index}</strong> {g.name ? <span class="muted">{g.name}</span> : null}{" "}
                      {g.job_id ? <Link href={`/jobs/${seg(g.job_id)}`}>{g.job_name ?? g.job_id}</Link> : g.other_org ? <span class="muted">another organisation</span> : <span class="muted">free</span>}
                    </li>
                  ))}
                </ul>
              ) : (
                <p class="muted small">No GPUs.</p>
              )}
              {node.jobs.length ? (
                <ul class="holders" aria-label={`Jobs on ${node.name}`}>
                  {node.jobs.map((j, i) => (
                    <li key={j.id ?? i}>
                      {j.id ? <Link href={`/jobs/${seg(j.id)}`}>{j.name ?? j.id}</Link> : <span class="muted">a job of another organisation</span>}{" "}
                      <span class="muted small">
                        {cpus(j.cpus)} CPU{j.memory ? `, ${bytes(j.memory)}` : ""}
                        {j.gpus.length ? `, GPU ${j.gpus.join(",")}` : ""}
                      </span>
                    </li>
                  ))}
                </ul>
              ) : null}
            </article>
          ))}
        </div>
      )}
    </Section>
  );
}

const WHY_LIMIT = 25;

function Queue() {
  const { data, error } = useApi<Items<Job>>("/jobs", { state: ["QUEUED", "RESTARTING"], limit: 100 }, 5000);
  const [whys, setWhys] = useState<Record<string, Why>>({});
  useEffect(() => {
    // Again after every refresh of the list: a reason changes as jobs ahead start or end.
    const ids = (data?.items ?? []).slice(0, WHY_LIMIT).map((j) => j.id);
    if (!ids.length) return undefined;
    let stop = false;
    Promise.all(ids.map((id) => get<Why>(`/jobs/${seg(id)}/why`).catch(() => null))).then((list) => {
      if (stop) return;
      const next: Record<string, Why> = {};
      for (const w of list) if (w) next[w.job_id] = w;
      setWhys(next);
    });
    return () => {
      stop = true;
    };
  }, [data]);
  const jobs = [...(data?.items ?? [])].sort((a, b) => (whys[a.id]?.position ?? 1e9) - (whys[b.id]?.position ?? 1e9));
  return (
    <Section title="Queue" id="queue">
      <ErrorBox error={error} />
      {!data ? (
        <Loading />
      ) : jobs.length === 0 ? (
        <Empty>Nothing is waiting.</Empty>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">#</th>
                <th scope="col">Job</th>
                <th scope="col">State</th>
                <th scope="col">Waiting because</th>
                <th scope="col">Priority</th>
                <th scope="col">Waiting for</th>
              </tr>
            </thead>
            <tbody>
              {jobs.map((job) => {
                const why = whys[job.id];
                return (
                  <tr key={job.id} data-testid="queue-row" data-job-id={job.id}>
                    <td>{why?.position ?? "—"}</td>
                    <td>
                      <Link href={`/jobs/${seg(job.id)}`}>{job.name}</Link>
                      <div class="muted small mono">{job.id}</div>
                    </td>
                    <td>
                      <StateBadge state={job.state} />
                    </td>
                    <td data-testid="queue-reason">
                      {why ? (
                        <>
                          {why.kind ? <span class="badge tone-wait">{why.kind}</span> : null} {why.message}
                        </>
                      ) : (
                        job.message ?? job.reason ?? "—"
                      )}
                    </td>
                    <td>{why?.priority ?? job.spec.priority}</td>
                    <td>{ago(job.created_at).replace(" ago", "")}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
          {data.items.length > WHY_LIMIT ? <p class="muted small">Reasons shown for the first {WHY_LIMIT} jobs.</p> : null}
        </div>
      )}
    </Section>
  );
}

function Quota() {
  const { data, error } = useApi<QuotaReport>("/quota", undefined, 10000);
  return (
    <Section title={data ? `Quota of ${data.org_name}` : "Quota"} id="quota">
      <ErrorBox error={error} />
      {!data ? <Loading /> : <QuotaTable report={data} />}
    </Section>
  );
}

export function QuotaTable({ report }: { report: QuotaReport }) {
  const cols: [keyof QuotaReport["categories"][number]["used"], string, (n: number) => string][] = [
    ["gpus", "GPUs", String],
    ["cpus", "CPUs", cpus],
    ["memory", "Memory", bytes],
    ["count", "Jobs", String],
    ["storage", "Storage", bytes],
  ];
  return (
    <div class="table-wrap">
      <table data-testid="quota-table">
        <thead>
          <tr>
            <th scope="col">Category</th>
            {cols.map(([, label]) => (
              <th scope="col" key={label}>
                {label}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {report.categories.map((c) => (
            <tr key={c.category} data-testid="quota-row" data-category={c.category}>
              <th scope="row">{c.category}</th>
              {cols.map(([field, label, fmt]) => (
                <td key={field}>
                  {c.used[field] === null && c.limits[field] === null ? (
                    <span class="muted">—</span>
                  ) : (
                    <Meter label={`${c.category} ${label}`} used={c.used[field]} limit={c.limits[field]} format={fmt} />
                  )}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
