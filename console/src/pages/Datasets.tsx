import { useState } from "preact/hooks";
import { filePath, seg, url } from "../api";
import { Empty, ErrorBox, Loading } from "../components/ui";
import { ago, bytes, time } from "../format";
import { useApi } from "../hooks";
import { Link, setQuery, useLocation } from "../router";
import type { DatasetSummary, DatasetVersion, Items } from "../types";

export function Datasets() {
  const { data, error } = useApi<Items<DatasetSummary>>("/datasets", undefined, 10000);
  return (
    <div class="stack">
      <h1>Datasets</h1>
      <ErrorBox error={error} />
      {!data ? (
        <Loading />
      ) : !data.items.length ? (
        <Empty>No datasets. `kiln data put LOCAL_PATH NAME` uploads one.</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Dataset</th>
                <th scope="col">Latest version</th>
                <th scope="col">Versions</th>
                <th scope="col">Files</th>
                <th scope="col">Size</th>
                <th scope="col">Updated</th>
              </tr>
            </thead>
            <tbody>
              {data.items.map((d) => (
                <tr key={d.name} data-testid="dataset-row">
                  <td>
                    <Link href={`/datasets/${seg(d.name)}`}>{d.name}</Link>
                  </td>
                  <td>{d.latest_version}</td>
                  <td>{d.versions}</td>
                  <td>{d.files.toLocaleString()}</td>
                  <td>{bytes(d.size)}</td>
                  <td>{ago(d.updated_at)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}

const FILES_SHOWN = 500;

export function DatasetDetail({ name }: { name: string }) {
  const { query } = useLocation();
  const versions = useApi<{ name: string; items: DatasetVersion[] }>(`/datasets/${seg(name)}`);
  const list = [...(versions.data?.items ?? [])].sort((a, b) => b.version - a.version);
  const chosen = Number(query.get("version")) || list[0]?.version;
  const manifest = useApi<DatasetVersion & { items: { path: string; size: number; sha256: string }[] }>(
    chosen ? `/datasets/${seg(name)}/versions/${chosen}` : null,
  );
  const [filter, setFilter] = useState("");
  const files = (manifest.data?.items ?? []).filter((f) => !filter || f.path.toLowerCase().includes(filter.toLowerCase()));
  return (
    <div class="stack" data-testid="dataset-detail">
      <div class="page-head">
        <h1>{name}</h1>
        <Link href="/datasets">All datasets</Link>
      </div>
      <ErrorBox error={versions.error} />
      <div class="two-col wide-right">
        <section class="card" aria-label="Versions">
          <h2>Versions</h2>
          {!versions.data ? (
            <Loading />
          ) : (
            <ul class="versions">
              {list.map((v) => (
                <li key={v.version}>
                  <button
                    type="button"
                    class={v.version === chosen ? "link current" : "link"}
                    aria-current={v.version === chosen ? "true" : undefined}
                    onClick={() => setQuery({ version: String(v.version) })}
                    data-testid="dataset-version"
                  >
                    v{v.version}
                  </button>{" "}
                  <span class="muted small">
                    {v.files} files, {bytes(v.size)}, {time(v.created_at)}
                  </span>
                </li>
              ))}
            </ul>
          )}
        </section>
        <section class="card" aria-label="Files">
          <div class="card-head">
            <h2>Files of v{chosen ?? "—"}</h2>
            <label class="field inline">
              <span class="label">Filter</span>
              <input type="search" value={filter} onInput={(e) => setFilter(e.currentTarget.value)} />
            </label>
          </div>
          <ErrorBox error={manifest.error} />
          {!manifest.data ? (
            chosen ? <Loading /> : <Empty>No versions.</Empty>
          ) : (
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th scope="col">Path</th>
                    <th scope="col">Size</th>
                    <th scope="col">SHA-256</th>
                  </tr>
                </thead>
                <tbody>
                  {files.slice(0, FILES_SHOWN).map((f) => (
                    <tr key={f.path} data-testid="dataset-file">
                      <td>
                        <a href={url(`/datasets/${seg(name)}/versions/${chosen}/files/${filePath(f.path)}`)} download={f.path.split("/").pop()}>
                          {f.path}
                        </a>
                      </td>
                      <td>{bytes(f.size)}</td>
                      <td class="mono small">{f.sha256.slice(0, 12)}…</td>
                    </tr>
                  ))}
                </tbody>
              </table>
              {files.length > FILES_SHOWN ? <p class="muted small">First {FILES_SHOWN} of {files.length.toLocaleString()} files; filter to find others.</p> : null}
            </div>
          )}
        </section>
      </div>
    </div>
  );
}
