import { useEffect, useState } from "preact/hooks";
import { ApiError, filePath, post, seg, url } from "../api";
import { ActionButton, Code, Empty, ErrorBox, KeyValues, Loading, Section, StateBadge, Tabs } from "../components/ui";
import { bytes, commandText, cpus, since, time } from "../format";
import { useApi } from "../hooks";
import { Link, navigate, useLocation } from "../router";
import { useAbilities } from "../session";
import { isActive, type Artifact, type Items, type Job, type JobEvent, type TensorBoardImage, type TensorBoardImages, type Why } from "../types";
import { JobLogs } from "./JobLogs";
import { JobMetrics } from "./JobMetrics";

const TABS = [
  { id: "overview", label: "Overview" },
  { id: "logs", label: "Logs" },
  { id: "metrics", label: "Metrics" },
  { id: "system", label: "System" },
  { id: "artifacts", label: "Artifacts" },
];

export function JobDetail({ id }: { id: string }) {
  const { query } = useLocation();
  const tab = TABS.some((t) => t.id === query.get("tab")) ? (query.get("tab") as string) : "overview";
  // Polled while it may still change; a finished job is read once more, then left alone.
  const job = useApi<Job>(`/jobs/${seg(id)}`, undefined, (j) => (!j || isActive(j.state) ? 2000 : false));
  const can = useAbilities();
  const j = job.data;

  if (!j) {
    return (
      <div class="stack">
        <ErrorBox error={job.error} />
        {!job.error ? <Loading /> : <Link href="/jobs">Back to jobs</Link>}
      </div>
    );
  }
  const cancel = async () => {
    await post(`/jobs/${seg(j.id)}/cancel`);
    job.reload();
  };
  // TensorBoard over this job's event files: one per job (tb-<id>), created or started again, then listed with
  // the notebooks, where it opens once it answers.
  const tensorboard = async () => {
    const name = `tb-${j.id.replace(/^job-/, "")}`;
    try {
      await post("/notebooks", { name, kind: "tensorboard", jobs: [j.id] });
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 409) throw err;
      await post(`/notebooks/${seg(name)}/start`);
    }
    navigate("/notebooks");
  };
  const rerun = async () => {
    const next = await post<Job>(`/jobs/${seg(j.id)}/rerun`, {});
    navigate(`/jobs/${seg(next.id)}`);
  };
  return (
    <div class="stack" data-testid="job-detail" data-job-id={j.id} data-state={j.state}>
      <div class="page-head">
        <div>
          <h1>
            {j.name} <StateBadge state={j.state} />
          </h1>
          <div class="mono muted small">{j.id}</div>
        </div>
        {can.write ? (
          <div class="actions">
            {isActive(j.state) ? (
              <ActionButton kind="danger" onClick={cancel} disabled={j.cancel_requested} data-testid="cancel-job">
                {j.cancel_requested ? "Cancelling…" : "Cancel job"}
              </ActionButton>
            ) : null}
            <ActionButton onClick={tensorboard} data-testid="job-tensorboard">
              TensorBoard
            </ActionButton>
            <ActionButton onClick={rerun} data-testid="rerun-job">
              Resubmit
            </ActionButton>
          </div>
        ) : null}
      </div>
      <ErrorBox error={job.error} title="Refresh failed" />
      <Tabs tabs={TABS} current={tab} />
      <div role="tabpanel" aria-labelledby={`tab-${tab}`}>
        {tab === "overview" ? <JobOverview job={j} /> : null}
        {tab === "logs" ? <JobLogs job={j} /> : null}
        {tab === "metrics" ? <JobMetrics job={j} system={false} /> : null}
        {tab === "system" ? <JobMetrics job={j} system /> : null}
        {tab === "artifacts" ? <Artifacts job={j} /> : null}
      </div>
    </div>
  );
}

function JobOverview({ job }: { job: Job }) {
  const waiting = job.state === "QUEUED" || job.state === "RESTARTING";
  const events = useApi<Items<JobEvent>>(`/jobs/${seg(job.id)}/events`, undefined, isActive(job.state) ? 3000 : false);
  const r = job.spec.resources;
  const slots = job.allocation?.slots ?? [];
  // An ended job holds nothing any more: where its last attempt was placed is in its STARTING event.
  const placed = [...(events.data?.items ?? [])].reverse().find((e) => e.to_state === "STARTING" && / placed on /.test(e.message ?? ""));
  const wherePlaced = placed ? (placed.message ?? "").replace(/^.* placed on /, "") : null;
  return (
    <div class="stack">
      {waiting ? <WhyWaiting job={job} /> : null}
      <div class="two-col">
        <Section title="Details" id="job-details">
          <KeyValues
            rows={[
              ["User", <span title={job.user_id}>{job.user_name ?? job.user_id}</span>],
              ["Submitted", time(job.created_at)],
              ["Started", time(job.running_at ?? job.started_at)],
              ["Finished", time(job.finished_at)],
              ["Ran", job.running_at ? since(job.running_at, job.finished_at) : "—"],
              ["Reason", <span data-testid="job-reason">{job.reason ?? "—"}</span>],
              ["Message", job.message || "—"],
              ["Exit code", job.exit_code ?? "—"],
              ["Attempt", `${job.attempt}${job.restarts ? ` (${job.restarts} restarts)` : ""}`],
              ["Asked", `${cpus(r.cpus)} CPU${r.memory ? `, ${bytes(r.memory)}` : ""}${r.gpus ? `, ${r.gpus} GPU` : ""}${job.spec.distributed ? ` per worker × ${job.spec.distributed.workers}` : ""}`],
              slots.length || !wherePlaced
                ? [
                    "Placed on",
                    slots.length ? slots.map((s) => `${s.node}: ${cpus(s.cpus)} CPU${s.gpus.length ? `, GPU ${s.gpus.join(",")}` : ""}`).join("; ") : "—",
                  ]
                : [isActive(job.state) ? "Placed on" : "Ran on", <span data-testid="job-ran-on">{`${wherePlaced}${isActive(job.state) ? "" : " (released when it ended)"}`}</span>],
            ]}
          />
        </Section>
        <Section title="Spec" id="job-spec">
          <KeyValues
            rows={[
              ["Command", <code class="wrap">{commandText(job.spec.command)}</code>],
              ["Runtime", [job.spec.runtime.framework, job.spec.runtime.version, job.spec.runtime.python, job.spec.runtime.image].filter(Boolean).join(" ") || "default"],
              ["Priority", job.spec.priority],
              ["Labels", Object.entries(job.spec.labels ?? {}).map(([k, v]) => <span class="chip" key={k}>{`${k}=${v}`}</span>)],
            ]}
          />
          <details>
            <summary>Whole spec (JSON)</summary>
            <Code>{JSON.stringify(job.spec, null, 2)}</Code>
          </details>
        </Section>
      </div>
      <Section title="Events" id="job-events">
        <ErrorBox error={events.error} />
        {!events.data ? (
          <Loading />
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Time</th>
                  <th scope="col">State</th>
                  <th scope="col">Reason</th>
                  <th scope="col">Message</th>
                </tr>
              </thead>
              <tbody>
                {events.data.items.map((e) => (
                  <tr key={e.id} data-testid="event-row">
                    <td class="nowrap">{time(e.time)}</td>
                    <td class="nowrap">{e.to_state ? `${e.from_state ?? "·"} → ${e.to_state}` : ""}</td>
                    <td>{e.reason}</td>
                    <td>{e.message}</td>
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

/** "Why is it waiting", as the scheduler says it: the limit that holds it with the numbers, its place in line,
 * and who is ahead. */
function WhyWaiting({ job }: { job: Job }) {
  const why = useApi<Why>(`/jobs/${seg(job.id)}/why`, undefined, 3000);
  const w = why.data;
  return (
    <Section title="Why is it waiting?" id="why">
      <ErrorBox error={why.error} />
      {!w ? (
        <Loading />
      ) : (
        <div class="why">
          <p class="why-message" data-testid="why-reason" data-kind={w.kind ?? ""}>
            {w.kind ? <span class="badge tone-wait">{w.kind}</span> : null} {w.message}
          </p>
          {w.position ? (
            <p data-testid="why-position">
              Position {w.position} of {w.queue_length} waiting, at {w.priority} priority.
            </p>
          ) : null}
          {w.ahead.length ? (
            <p>
              Ahead of it:{" "}
              {w.ahead.map((a, i) => (
                <span key={i}>
                  {i ? ", " : ""}
                  {a.id ? <Link href={`/jobs/${seg(a.id)}`}>{a.name ?? a.id}</Link> : a.other_org ? "a job of another organisation" : a.name}
                </span>
              ))}
            </p>
          ) : null}
        </div>
      )}
    </Section>
  );
}

/** The job's artifacts and checkpoints as folders to browse; each file downloads with the session cookie. Above
 * them, the images of its TensorBoard event files, when it wrote any. */
function Artifacts({ job }: { job: Job }) {
  const artifacts = useApi<Items<Artifact>>(`/jobs/${seg(job.id)}/artifacts`, undefined, isActive(job.state) ? 5000 : false);
  const checkpoints = useApi<Items<Artifact>>(`/jobs/${seg(job.id)}/checkpoints`);
  return (
    <div class="stack">
      <TensorBoardImagesSection job={job} />
      <FileBrowser title="Artifacts" kind="artifacts" job={job} loaded={artifacts} />
      <FileBrowser title="Checkpoints" kind="checkpoints" job={job} loaded={checkpoints} />
    </div>
  );
}

/** The images the job wrote with TensorBoard (add_image, tf.summary.image): per tag, the image(s) of one step, the
 * last one first, another chosen from the tag's steps. Shown only when there are some. */
function TensorBoardImagesSection({ job }: { job: Job }) {
  const listed = useApi<TensorBoardImages>(`/jobs/${seg(job.id)}/tensorboard-images`, undefined, isActive(job.state) ? 10000 : false);
  const items = (listed.data?.items ?? []).filter((i) => i.media_type);
  if (!items.length) return null;
  const tags = new Map<string, TensorBoardImage[]>();
  for (const item of items) tags.set(item.tag, [...(tags.get(item.tag) ?? []), item]);
  return (
    <Section title="TensorBoard images" id="tensorboard-images">
      {listed.data?.truncated ? <p class="muted small">Not every image is listed: {listed.data.notes.join("; ")}</p> : null}
      <div class="stack">
        {[...tags.entries()].map(([tag, images]) => (
          <TensorBoardTag key={tag} job={job} tag={tag} images={images} />
        ))}
      </div>
    </Section>
  );
}

function TensorBoardTag({ job, tag, images }: { job: Job; tag: string; images: TensorBoardImage[] }) {
  const steps = [...new Set(images.map((i) => i.step))]; // sorted by the server
  const [chosen, setChosen] = useState<number | null>(null);
  const step = chosen !== null && steps.includes(chosen) ? chosen : steps[steps.length - 1];
  const shown = images.filter((i) => i.step === step);
  const many = steps.length > 40;
  return (
    <div class="card" data-testid="tb-image-tag" data-tag={tag}>
      <div class="card-head">
        <strong class="mono">{tag}</strong>
        <span data-testid="tb-image-step">step {step}</span>
        <label class="small">
          step{" "}
          <select aria-label="step" value={String(step)} onChange={(e) => setChosen(Number((e.target as HTMLSelectElement).value))}>
            {steps.map((s) => (
              <option key={s} value={String(s)}>
                {s}
              </option>
            ))}
          </select>
        </label>
      </div>
      {shown.map((i) => (
        <img
          key={`${i.file}:${i.offset}:${i.index}`}
          src={url(`/jobs/${seg(job.id)}/tensorboard-images/image`, { file: i.file, offset: i.offset, index: i.index })}
          alt={`${tag} at step ${step}${shown.length > 1 ? ` (${i.index + 1} of ${shown.length})` : ""}`}
          width={i.width || undefined}
          height={i.height || undefined}
          class="preview-image tb-image"
        />
      ))}
      <p class="muted small" data-testid="tb-image-steps">
        {steps.length} step{steps.length === 1 ? "" : "s"}: {many ? `${steps.slice(0, 20).join(", ")} … ${steps.slice(-20).join(", ")}` : steps.join(", ")}
      </p>
    </div>
  );
}

const IMAGE = /\.(png|jpe?g|gif|webp)$/i;
const TEXT = /\.(txt|log|md|py|ya?ml|toml|cfg|ini|sh|json|jsonl|csv|tsv)$/i;
const MAX_PREVIEW = { image: 20 * 1024 * 1024, text: 2 * 1024 * 1024 };
const previewable = (f: Artifact): boolean =>
  (IMAGE.test(f.path) && f.size <= MAX_PREVIEW.image) || (TEXT.test(f.path) && f.size <= MAX_PREVIEW.text);

/** A file shown in the page: an image as itself, JSON pretty-printed, CSV/TSV as a table of its first rows, other
 * text as its first lines. */
function Preview({ href, file, onClose }: { href: string; file: Artifact; onClose: () => void }) {
  const [text, setText] = useState<string | null>(null);
  const [failed, setFailed] = useState<string | null>(null);
  const image = IMAGE.test(file.path);
  useEffect(() => {
    if (image) return undefined;
    const abort = new AbortController();
    fetch(href, { credentials: "same-origin", signal: abort.signal })
      .then((r) => (r.ok ? r.text() : Promise.reject(new Error(`HTTP ${r.status}`))))
      .then(setText)
      .catch((err) => err.name !== "AbortError" && setFailed(String(err.message ?? err)));
    return () => abort.abort();
  }, [href]);
  let body;
  if (image) body = <img src={href} alt={file.path} class="preview-image" data-testid="preview-image" />;
  else if (failed) body = <p class="error">{failed}</p>;
  else if (text === null) body = <Loading />;
  else if (/\.json$/i.test(file.path)) {
    let shown = text;
    try {
      shown = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      /* not JSON after all: as it is */
    }
    body = <pre class="preview-text" data-testid="preview-text">{shown.split("\n").slice(0, 400).join("\n")}</pre>;
  } else if (/\.(csv|tsv)$/i.test(file.path)) {
    const sep = /\.tsv$/i.test(file.path) ? "\t" : ",";
    const rows = text.split(/\r?\n/).filter(Boolean).slice(0, 21).map((line) => line.split(sep));
    body = (
      <div class="table-wrap">
        <table data-testid="preview-table">
          <thead>
            <tr>{rows[0]?.map((cell, i) => <th key={i}>{cell}</th>)}</tr>
          </thead>
          <tbody>
            {rows.slice(1).map((row, r) => (
              <tr key={r}>{row.map((cell, i) => <td key={i} class="mono small">{cell}</td>)}</tr>
            ))}
          </tbody>
        </table>
        <p class="muted small">the first {rows.length - 1} rows</p>
      </div>
    );
  } else body = <pre class="preview-text" data-testid="preview-text">{text.split("\n").slice(0, 400).join("\n")}</pre>;
  return (
    <div class="card" data-testid="preview">
      <div class="card-head">
        <strong class="mono">{file.path}</strong> <span class="muted small">{bytes(file.size)}</span>{" "}
        <button type="button" class="link" onClick={onClose}>
          close
        </button>
      </div>
      {body}
    </div>
  );
}

function FileBrowser({ title, kind, job, loaded }: { title: string; kind: string; job: Job; loaded: { data?: Items<Artifact>; error: unknown } }) {
  const [dir, setDir] = useState("");
  const [shown, setShown] = useState<Artifact | null>(null);
  const files = loaded.data?.items ?? [];
  const inDir = files.filter((f) => f.path.startsWith(dir));
  const folders = new Map<string, { files: number; size: number }>();
  const here: Artifact[] = [];
  for (const f of inDir) {
    const rest = f.path.slice(dir.length);
    const slash = rest.indexOf("/");
    if (slash < 0) here.push(f);
    else {
      const name = rest.slice(0, slash + 1);
      const agg = folders.get(name) ?? { files: 0, size: 0 };
      folders.set(name, { files: agg.files + 1, size: agg.size + f.size });
    }
  }
  const crumbs = dir.split("/").filter(Boolean);
  return (
    <Section title={title} id={`files-${kind}`}>
      <ErrorBox error={loaded.error} />
      {!loaded.data ? (
        <Loading />
      ) : files.length === 0 ? (
        <Empty>{`No ${kind}${isActive(job.state) ? " yet" : ""}.`}</Empty>
      ) : (
        <>
          <nav class="crumbs" aria-label={`${title} folder`}>
            <button type="button" class="link" onClick={() => setDir("")}>
              {kind}
            </button>
            {crumbs.map((c, i) => (
              <span key={i}>
                {" / "}
                <button type="button" class="link" onClick={() => setDir(`${crumbs.slice(0, i + 1).join("/")}/`)}>
                  {c}
                </button>
              </span>
            ))}
          </nav>
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Size</th>
                  <th scope="col"></th>
                </tr>
              </thead>
              <tbody>
                {[...folders.entries()].map(([name, agg]) => (
                  <tr key={name} data-testid="folder-row">
                    <td>
                      <button type="button" class="link" onClick={() => setDir(dir + name)}>
                        📁 {name}
                      </button>{" "}
                      <span class="muted small">{agg.files} files</span>
                    </td>
                    <td>{bytes(agg.size)}</td>
                  </tr>
                ))}
                {here.map((f) => (
                  <tr key={f.path} data-testid="artifact-row">
                    <td>
                      <a href={url(`/jobs/${seg(job.id)}/${kind}/${filePath(f.path)}`)} download={f.path.split("/").pop()} data-testid="artifact-download">
                        {f.path.slice(dir.length)}
                      </a>
                    </td>
                    <td>{bytes(f.size)}</td>
                    <td>
                      {previewable(f) ? (
                        <button type="button" class="link" data-testid="artifact-preview" onClick={() => setShown(f)}>
                          preview
                        </button>
                      ) : null}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          {shown ? <Preview href={url(`/jobs/${seg(job.id)}/${kind}/${filePath(shown.path)}`)} file={shown} onClose={() => setShown(null)} /> : null}
        </>
      )}
    </Section>
  );
}
