import { useEffect, useState } from "preact/hooks";
import { describe, patch, post, seg } from "../api";
import { ActionButton, Code, Empty, ErrorBox, Field, KeyValues, Loading, Section, StateBadge } from "../components/ui";
import { ago, bytes, cpus, time } from "../format";
import { useApi } from "../hooks";
import { Link } from "../router";
import { useAbilities } from "../session";
import { exampleBody } from "../predictExample";
import type { ApiRequest, Items, ModelVersion, Service } from "../types";
import { ServiceTraffic } from "./ServiceTraffic";

export function Services() {
  const { data, error } = useApi<Items<Service>>("/services", undefined, 5000);
  return (
    <div class="stack">
      <h1>Services</h1>
      <ErrorBox error={error} />
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>No services. `kiln serve -f service.yaml --name NAME` deploys one (docs/serving.md has the spec).</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Service</th>
                <th scope="col">State</th>
                <th scope="col">Model</th>
                <th scope="col">Replicas ready</th>
                <th scope="col">Revision</th>
                <th scope="col">Updated</th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((s) => (
                <tr key={s.id} data-testid="service-row">
                  <td>
                    <Link href={`/services/${seg(s.name)}`}>{s.name}</Link>
                  </td>
                  <td>
                    <StateBadge state={s.state} />
                  </td>
                  <td>
                    <Link href={`/models/${seg(s.model_name)}`}>
                      {s.model_name}@{s.model_version}
                    </Link>
                  </td>
                  <td>
                    {s.ready_replicas} / {s.desired_replicas}
                  </td>
                  <td>{s.revision}</td>
                  <td>{ago(s.updated_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

export function ServiceDetail({ name }: { name: string }) {
  const can = useAbilities();
  const svc = useApi<Service>(`/services/${seg(name)}`, undefined, 3000);
  const s = svc.data;
  if (!s) return <div class="stack">{svc.error ? <ErrorBox error={svc.error} /> : <Loading />}</div>;
  const r = s.spec.resources;
  return (
    <div class="stack" data-testid="service-detail">
      <div class="page-head">
        <div>
          <h1>
            {s.name} <StateBadge state={s.state} />
          </h1>
          <div class="mono muted small">{s.endpoint}</div>
        </div>
        {can.write && !s.spec.autoscale ? <Scale service={s} onDone={svc.reload} /> : null}
      </div>
      <ErrorBox error={svc.error} title="Refresh failed" />
      <Section title="Service" id="service-summary">
        <KeyValues
          rows={[
            ["Model", <Link href={`/models/${seg(s.model_name)}`}>{`${s.model_name}@${s.model_version}`}</Link>],
            ["Asked for", s.spec.model],
            ["Predictor", s.spec.predictor.type],
            ["Replicas", `${s.ready_replicas} ready of ${s.desired_replicas}${s.spec.autoscale ? " (autoscaled)" : ""}`],
            ["Each replica", `${cpus(r?.cpus)} CPU${r?.memory ? `, ${bytes(r.memory)}` : ""}${r?.gpus ? `, ${r.gpus} GPU` : ""}`],
            ["Revision", s.revision],
            ["Message", s.message || "—"],
            ["Updated", time(s.updated_at)],
          ]}
        />
      </Section>
      <ServiceTraffic service={s} canWrite={can.write} onDone={svc.reload} />
      <Section title="Replicas" id="replicas">
        {!s.replicas.length ? (
          <Empty>No replicas{s.desired_replicas === 0 ? " (scaled to zero: the next request starts one)" : ""}.</Empty>
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Replica</th>
                  <th scope="col">Health</th>
                  <th scope="col">Revision</th>
                  <th scope="col">Model version</th>
                  <th scope="col">In flight</th>
                  <th scope="col">Job</th>
                  <th scope="col">Ready since</th>
                  <th scope="col">Message</th>
                </tr>
              </thead>
              <tbody>
                {s.replicas.map((rep) => (
                  <tr key={rep.id} data-testid="replica-row" data-state={rep.state}>
                    <td class="mono small">{rep.id}</td>
                    <td>
                      <StateBadge state={rep.state} />
                    </td>
                    <td>{rep.revision}</td>
                    <td>
                      {rep.model_version} {rep.canary ? <span class="muted small">canary</span> : rep.shadow ? <span class="muted small">shadow</span> : null}
                    </td>
                    <td>{rep.in_flight}</td>
                    <td>
                      {rep.job_id ? <Link href={`/jobs/${seg(rep.job_id)}`}>{rep.job_id}</Link> : "—"} {rep.job_state ? <span class="muted small">{rep.job_state}</span> : null}
                    </td>
                    <td>{rep.ready_at ? ago(rep.ready_at) : "—"}</td>
                    <td>{rep.message}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Section>
      {can.write ? <Predict service={s} /> : null}
    </div>
  );
}

function Scale({ service, onDone }: { service: Service; onDone: () => void }) {
  const [n, setN] = useState(String(service.desired_replicas));
  return (
    <div class="actions">
      <label class="field inline">
        <span class="label">Replicas</span>
        <input type="number" min="0" max="64" value={n} onInput={(e) => setN(e.currentTarget.value)} style={{ width: "5em" }} data-testid="scale-input" />
      </label>
      <ActionButton onClick={async () => (await patch(`/services/${seg(service.name)}`, { replicas: Number(n) } satisfies ApiRequest<"ServiceUpdate">), onDone())} data-testid="scale-service">
        Scale
      </ActionButton>
    </div>
  );
}

/** Try the service: a JSON body `{"inputs": [...]}` sent as the console's user (a signed-in predict), prefilled
 * with an instance of the shape the model takes (its input schema, or the signature of a version from a run). */
function Predict({ service }: { service: Service }) {
  const schema = service.spec.predictor.input_schema;
  const fromRun = service.spec.predictor.type === "mlflow" && !schema;
  const version = useApi<ModelVersion>(fromRun ? `/models/${seg(service.model_name)}/versions/${service.model_version}` : null);
  const [body, setBody] = useState(() => exampleBody(schema));
  const [edited, setEdited] = useState(false);
  useEffect(() => {
    if (!edited && version.data) setBody(exampleBody(schema, version.data.signature));
  }, [version.data]);
  const [answer, setAnswer] = useState<unknown>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const send = async (e: Event) => {
    e.preventDefault();
    setError(null);
    setAnswer(null);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch (err) {
      setError(`the body is not JSON: ${describe(err)}`);
      return;
    }
    setBusy(true);
    try {
      setAnswer(await post(`/services/${seg(service.name)}/predict`, parsed));
    } catch (err) {
      setError(describe(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <Section title="Try a prediction" id="predict">
      <form onSubmit={send} class="stack" data-testid="predict-form">
        <Field label="Request body (JSON)" hint='{"inputs": [instance, …]}' wide>
          <textarea rows={6} class="mono" value={body} onInput={(e) => (setEdited(true), setBody(e.currentTarget.value))} data-testid="predict-body" />
        </Field>
        <div>
          <button type="submit" class="btn btn-primary" disabled={busy} data-testid="predict-send">
            {busy ? "Predicting…" : "Predict"}
          </button>
        </div>
        {error ? (
          <div class="error" role="alert" data-testid="predict-error">
            {error}
          </div>
        ) : null}
        {answer !== null ? (
          <div data-testid="predict-answer">
            <Code>{JSON.stringify(answer, null, 2)}</Code>
          </div>
        ) : null}
      </form>
    </Section>
  );
}
