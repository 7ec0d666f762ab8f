import { useState } from "preact/hooks";
import { describe, post, seg } from "../api";
import { Field } from "../components/ui";
import { parseBytes } from "../format";
import { useApi } from "../hooks";
import { Link, navigate } from "../router";
import { useAbilities } from "../session";
import type { ApiRequest, Items, Job, JobSpecInput, Runtime } from "../types";

/** The few fields most jobs need; the CLI's job.yaml takes the rest (env, inputs, distributed, metrics, …). */
export function JobSubmit() {
  const can = useAbilities();
  const runtimes = useApi<Items<Runtime>>("/runtimes");
  const frameworks = [...new Set((runtimes.data?.items ?? []).map((r) => r.framework))];
  const [form, setForm] = useState({ name: "", command: "", framework: "python", cpus: "1", memory: "", gpus: "0", labels: "" });
  const [problems, setProblems] = useState<Record<string, string>>({});
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const set = (key: keyof typeof form) => (e: Event) => setForm({ ...form, [key]: (e.currentTarget as HTMLInputElement).value });

  if (!can.write) {
    return (
      <div class="card">
        <h1>Submit a job</h1>
        <p>This user may read but not submit jobs.</p>
      </div>
    );
  }

  const check = (): JobSpecInput | null => {
    const bad: Record<string, string> = {};
    if (!form.command.trim()) bad.command = "a command is needed";
    const cpus = Number(form.cpus);
    if (!(cpus > 0)) bad.cpus = "a number above 0, e.g. 1 or 0.5";
    const gpus = Number(form.gpus || "0");
    if (!Number.isInteger(gpus) || gpus < 0) bad.gpus = "a whole number, 0 or more";
    const memory = parseBytes(form.memory);
    if (memory !== null && !(memory > 0)) bad.memory = "bytes, or e.g. 2G, 512Mi";
    const labels: Record<string, string> = {};
    for (const term of form.labels.split(",").map((t) => t.trim()).filter(Boolean)) {
      const [k, v] = term.split("=", 2);
      if (!k || v === undefined) bad.labels = `“${term}”: write key=value`;
      else labels[k.trim()] = v.trim();
    }
    setProblems(bad);
    if (Object.keys(bad).length) return null;
    return {
      name: form.name.trim() || undefined,
      command: form.command,
      runtime: form.framework ? { framework: form.framework } : {},
      resources: { cpus, gpus, ...(memory ? { memory } : {}) },
      labels,
    };
  };

  const submit = async (e: Event) => {
    e.preventDefault();
    const spec = check();
    if (!spec) return;
    setBusy(true);
    setError(null);
    try {
      const job = await post<Job>("/jobs", { spec } satisfies ApiRequest<"JobSubmit">);
      navigate(`/jobs/${seg(job.id)}`);
    } catch (err) {
      setError(describe(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="stack">
      <div class="page-head">
        <h1>Submit a job</h1>
        <Link href="/jobs">Back to jobs</Link>
      </div>
      <form class="card form-grid" onSubmit={submit} data-testid="submit-form" noValidate>
        <Field label="Name" hint="optional; default: the command">
          <input value={form.name} onInput={set("name")} maxLength={128} data-testid="submit-name" />
        </Field>
        <Field label="Runtime framework">
          <select value={form.framework} onChange={set("framework")} data-testid="submit-framework">
            <option value="">none (the server's Python)</option>
            {(frameworks.length ? frameworks : ["python"]).map((f) => (
              <option key={f} value={f}>
                {f}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Command" hint="run with /bin/sh -c in the job's work dir" error={problems.command} wide>
          <textarea
            rows={4}
            value={form.command}
            onInput={set("command")}
            required
            data-testid="submit-command"
            placeholder="python -c 'print(42)'"
          />
        </Field>
        <Field label="CPUs" error={problems.cpus}>
          <input type="number" min="0" step="0.25" value={form.cpus} onInput={set("cpus")} data-testid="submit-cpus" />
        </Field>
        <Field label="Memory" hint="e.g. 2G, 512Mi; empty: no reservation" error={problems.memory}>
          <input value={form.memory} onInput={set("memory")} data-testid="submit-memory" />
        </Field>
        <Field label="GPUs" error={problems.gpus}>
          <input type="number" min="0" step="1" value={form.gpus} onInput={set("gpus")} data-testid="submit-gpus" />
        </Field>
        <Field label="Labels" hint="key=value, comma-separated" error={problems.labels}>
          <input value={form.labels} onInput={set("labels")} data-testid="submit-labels" />
        </Field>
        <div class="wide form-actions">
          {error ? (
            <div class="error" role="alert" data-testid="submit-error">
              {error}
            </div>
          ) : null}
          <button class="btn btn-primary" type="submit" disabled={busy} data-testid="submit-job">
            {busy ? "Submitting…" : "Submit"}
          </button>
        </div>
      </form>
    </div>
  );
}
