import { ApiError, seg } from "../api";
import { Empty, ErrorBox, Loading, Section, StateBadge } from "../components/ui";
import { ago, bytes, num, time } from "../format";
import { useApi } from "../hooks";
import { Link } from "../router";
import type { Items, ModelSummary, ModelVersion } from "../types";

function Unavailable({ error }: { error: unknown }) {
  if (error instanceof ApiError && error.status === 404 && error.code !== "not_found") {
    return <Empty>This server has no model registry.</Empty>;
  }
  return <ErrorBox error={error} />;
}

export function Models() {
  const { data, error } = useApi<Items<ModelSummary>>("/models", undefined, 10000);
  return (
    <div class="stack">
      <h1>Models</h1>
      {error ? <Unavailable error={error} /> : null}
      {!data ? (
        !error ? <Loading /> : null
      ) : !data.items.length ? (
        <Empty>No models registered. `kiln models register NAME --from-job JOB --path PATH` makes one from a job's outputs.</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Model</th>
                <th scope="col">Latest</th>
                <th scope="col">Versions</th>
                <th scope="col">Aliases</th>
                <th scope="col">Size</th>
                <th scope="col">Updated</th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((m) => (
                <tr key={m.name} data-testid="model-row">
                  <td>
                    <Link href={`/models/${seg(m.name)}`}>{m.name}</Link>
                  </td>
                  <td>{m.latest_version ?? "—"}</td>
                  <td>{m.versions}</td>
                  <td>
                    {Object.entries(m.aliases).map(([a, v]) => (
                      <span class="chip" key={a}>
                        {a}→{v}
                      </span>
                    ))}
                  </td>
                  <td>{bytes(m.size)}</td>
                  <td>{ago(m.updated_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

/** A model's versions with their lineage: the job (and study trial) each came from and its final metrics. */
export function ModelDetail({ name }: { name: string }) {
  const { data, error } = useApi<ModelSummary & { items: ModelVersion[] }>(`/models/${seg(name)}`, undefined, 10000);
  if (!data) return <div class="stack">{error ? <ErrorBox error={error} /> : <Loading />}</div>;
  return (
    <div class="stack" data-testid="model-detail">
      <div class="page-head">
        <h1>{data.name}</h1>
        <Link href="/models">All models</Link>
      </div>
      {data.items.map((v) => (
        <Section key={v.version} title={`Version ${v.version}`} id={`model-version-${v.version}`}>
          <div class="two-col">
            <dl class="kv">
              <div>
                <dt>Aliases</dt>
                <dd>{v.aliases.length ? v.aliases.map((a) => <span class="chip" key={a}>{a}</span>) : "—"}</dd>
              </div>
              <div>
                <dt>Framework</dt>
                <dd>{v.framework}</dd>
              </div>
              <div>
                <dt>Registered</dt>
                <dd>
                  {time(v.created_at)} by {v.created_by}
                </dd>
              </div>
              <div>
                <dt>Files</dt>
                <dd>
                  {v.file_count} ({bytes(v.size)}) from {v.source_path}
                </dd>
              </div>
              {v.description ? (
                <div>
                  <dt>Description</dt>
                  <dd>{v.description}</dd>
                </div>
              ) : null}
            </dl>
            <dl class="kv" data-testid="lineage">
              <div>
                <dt>Trained by</dt>
                <dd>
                  <Link href={`/jobs/${seg(v.lineage.job_id)}`}>{v.lineage.job_name ?? v.lineage.job_id}</Link>{" "}
                  {v.lineage.job_state ? <StateBadge state={v.lineage.job_state} /> : null}
                </dd>
              </div>
              {v.lineage.study_id ? (
                <div>
                  <dt>Study</dt>
                  <dd>
                    <Link href={`/studies/${seg(v.lineage.study_id)}`}>{v.lineage.study_id}</Link>
                    {v.lineage.trial != null ? `, trial #${v.lineage.trial}` : ""}
                  </dd>
                </div>
              ) : null}
              <div>
                <dt>Metrics</dt>
                <dd>
                  {Object.entries(v.lineage.metrics).map(([k, m]) => (
                    <span class="chip" key={k}>
                      {k}={num(m)}
                    </span>
                  ))}
                </dd>
              </div>
            </dl>
          </div>
        </Section>
      ))}
    </div>
  );
}
