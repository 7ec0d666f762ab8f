import { useState } from "preact/hooks";
import { del, post, seg } from "../api";
import { ActionButton, Empty, ErrorBox, Loading, StateBadge } from "../components/ui";
import { ago } from "../format";
import { useApi } from "../hooks";
import { useAbilities, useSession } from "../session";
import type { Items, Notebook } from "../types";

// JupyterLab through Kiln's proxy: /notebooks/{id}/lab opens in this browser with the console's session (the proxy
// lets a notebook's own user in, and wants this page's Origin for anything that changes something).
export function Notebooks() {
  const can = useAbilities();
  const session = useSession();
  const { data, error, reload } = useApi<Items<Notebook>>("/notebooks", undefined, 3000);
  return (
    <div class="stack">
      <h1>Notebooks</h1>
      <ErrorBox error={error} />
      {can.write ? <CreateNotebook onDone={reload} /> : null}
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>No notebooks. `kiln notebooks create NAME --runtime pytorch` starts one.</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Notebook</th>
                <th scope="col">State</th>
                <th scope="col">Runtime</th>
                <th scope="col">Last activity</th>
                <th scope="col">Why</th>
                <th scope="col"></th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((nb) => {
                const mine = session?.user.user_id === nb.user_id;
                return (
                  <tr key={nb.id} data-testid="notebook-row">
                    <td>
                      {nb.state === "RUNNING" && mine ? (
                        <a href={`/notebooks/${seg(nb.id)}/${nb.spec.kind === "tensorboard" ? "" : "lab"}`} target="_blank" rel="noopener" data-testid="open-notebook">
                          {nb.name}
                        </a>
                      ) : (
                        nb.name
                      )}
                    </td>
                    <td>
                      <StateBadge state={nb.state} />
                    </td>
                    <td class="mono small">
                      {nb.spec.kind === "tensorboard"
                        ? `TensorBoard: ${(nb.spec.jobs ?? []).join(", ")}`
                        : `${nb.spec.runtime.framework}${nb.spec.runtime.version ? `==${nb.spec.runtime.version}` : ""}`}
                    </td>
                    <td>{nb.last_activity ? ago(nb.last_activity) : "-"}</td>
                    <td class="small muted">{nb.message}</td>
                    <td>
                      {can.write && (nb.state === "RUNNING" || nb.state === "STARTING") ? (
                        <ActionButton onClick={async () => { await post(`/notebooks/${seg(nb.id)}/stop`); reload(); }}>
                          Stop
                        </ActionButton>
                      ) : null}
                      {can.write && mine && (nb.state === "STOPPED" || nb.state === "FAILED") ? (
                        <ActionButton onClick={async () => { await post(`/notebooks/${seg(nb.id)}/start`); reload(); }}>
                          Start
                        </ActionButton>
                      ) : null}
                      {can.write && mine && nb.state !== "RUNNING" && nb.state !== "STARTING" ? (
                        <ActionButton kind="danger" onClick={async () => { await del(`/notebooks/${seg(nb.id)}`); reload(); }}>
                          Delete
                        </ActionButton>
                      ) : null}
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

function CreateNotebook({ onDone }: { onDone: () => void }) {
  const [name, setName] = useState("");
  const [framework, setFramework] = useState("python");
  const [idle, setIdle] = useState("1h");
  return (
    <form class="card row" data-testid="create-notebook" onSubmit={(e) => e.preventDefault()}>
      <label>
        Name <input value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} name="name" />
      </label>
      <label>
        Runtime <input value={framework} onInput={(e) => setFramework((e.target as HTMLInputElement).value)} name="runtime" />
      </label>
      <label>
        Idle timeout <input value={idle} onInput={(e) => setIdle((e.target as HTMLInputElement).value)} name="idle" />
      </label>
      <ActionButton
        kind="primary"
        onClick={async () => {
          await post("/notebooks", { name, runtime: { framework }, idle_timeout: idle });
          setName("");
          onDone();
        }}
      >
        Create
      </ActionButton>
    </form>
  );
}
