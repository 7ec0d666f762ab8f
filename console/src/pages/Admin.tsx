// Organisations, users, access keys, quotas, the audit trail and (platform admins) the servers. What each tab offers follows the signed-in
// user's role (a viewer reads its own keys; an organisation admin manages its users and keys and reads its audit
// trail; a platform admin everything); the server checks the same and refuses the rest.

import { useState } from "preact/hooks";
import { del, describe, patch, post, put, seg } from "../api";
import { ActionButton, Code, Empty, ErrorBox, Field, Loading, Section, Tabs } from "../components/ui";
import { ago, parseBytes, time } from "../format";
import { useApi } from "../hooks";
import { useLocation } from "../router";
import { useAbilities, useSession } from "../session";
import { PRIORITIES } from "../types";
import type { ApiRequest, AuditRecord, Items, Key, Org, Priority, QuotaReport, UserRow } from "../types";
import { Servers } from "./AdminServers";
import { QuotaTable } from "./Overview";

export function Admin() {
  const can = useAbilities();
  const { query } = useLocation();
  const tabs = [
    { id: "keys", label: "Access keys" },
    ...(can.orgAdmin ? [{ id: "users", label: "Users" }] : []),
    { id: "orgs", label: can.platformAdmin ? "Organisations" : "Organisation" },
    { id: "quotas", label: "Quotas" },
    ...(can.orgAdmin ? [{ id: "audit", label: "Audit" }] : []),
    ...(can.platformAdmin ? [{ id: "servers", label: "Servers" }] : []),
  ];
  const tab = tabs.some((t) => t.id === query.get("tab")) ? (query.get("tab") as string) : "keys";
  return (
    <div class="stack">
      <h1>{can.orgAdmin ? "Admin" : "Account"}</h1>
      <Tabs tabs={tabs} current={tab} />
      <div role="tabpanel" aria-labelledby={`tab-${tab}`}>
        {tab === "keys" ? <Keys /> : null}
        {tab === "users" ? <Users /> : null}
        {tab === "orgs" ? <Orgs /> : null}
        {tab === "quotas" ? <Quotas /> : null}
        {tab === "audit" ? <Audit /> : null}
        {tab === "servers" ? <Servers /> : null}
      </div>
    </div>
  );
}

function Keys() {
  const can = useAbilities();
  const session = useSession();
  const [user, setUser] = useState("");
  const keys = useApi<Items<Key>>("/keys", { user: user || undefined });
  const [created, setCreated] = useState<Key | null>(null);
  const [form, setForm] = useState({ user: "", description: "", expires: "" });
  const [error, setError] = useState<string | null>(null);

  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    const days = Number(form.expires);
    if (form.expires && !(days > 0)) return setError("expires in: a number of days above 0");
    try {
      const key = await post<Key>("/keys", {
        user: form.user.trim() || undefined,
        description: form.description,
        expires_in: form.expires ? days * 86400 : undefined,
      } satisfies ApiRequest<"KeyCreate">);
      setCreated(key);
      keys.reload();
    } catch (err) {
      setError(describe(err));
    }
    return undefined;
  };
  const mine = (k: Key) => k.user_id === session?.user.user_id;
  return (
    <div class="stack">
      {created ? (
        <div class="card secret" role="status" data-testid="key-secret">
          <h2>New key {created.id}</h2>
          <p>
            <strong>Copy the secret now: Kiln shows it only this once.</strong>
          </p>
          <Code>{`KILN_ACCESS_KEY=${created.id}\nKILN_SECRET_KEY=${created.secret_key}`}</Code>
          <button type="button" class="btn" onClick={() => setCreated(null)}>
            I have copied it
          </button>
        </div>
      ) : null}
      {can.write ? (
        <Section title="Create a key" id="key-create">
          <form class="form-row" onSubmit={create}>
            {can.orgAdmin ? (
              <Field label="For user" hint="name or id; empty: yourself">
                <input value={form.user} onInput={(e) => setForm({ ...form, user: e.currentTarget.value })} data-testid="key-user" />
              </Field>
            ) : null}
            <Field label="Description">
              <input value={form.description} maxLength={256} onInput={(e) => setForm({ ...form, description: e.currentTarget.value })} data-testid="key-description" />
            </Field>
            <Field label="Expires in (days)" hint="empty: never">
              <input type="number" min="0" value={form.expires} onInput={(e) => setForm({ ...form, expires: e.currentTarget.value })} />
            </Field>
            <button type="submit" class="btn btn-primary" data-testid="key-create-submit">
              Create key
            </button>
            {error ? (
              <div class="error" role="alert">
                {error}
              </div>
            ) : null}
          </form>
        </Section>
      ) : null}
      <Section
        title="Keys"
        id="keys"
        actions={
          can.orgAdmin ? (
            <label class="field inline">
              <span class="label">User</span>
              <input type="search" value={user} onChange={(e) => setUser(e.currentTarget.value)} placeholder="all" />
            </label>
          ) : null
        }
      >
        <ErrorBox error={keys.error} />
        {!keys.data ? (
          <Loading />
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Key</th>
                  <th scope="col">User</th>
                  <th scope="col">Description</th>
                  <th scope="col">Enabled</th>
                  <th scope="col">Expires</th>
                  <th scope="col">Last used</th>
                  <th scope="col">
                    <span class="sr-only">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {keys.data.items.map((k) => (
                  <tr key={k.id} data-testid="key-row">
                    <td class="mono">{k.id}</td>
                    <td>{k.user_name}</td>
                    <td>{k.description}</td>
                    <td>{k.enabled ? "yes" : "no"}</td>
                    <td>{k.expires_at ? time(k.expires_at) : "never"}</td>
                    <td>{k.last_used_at ? ago(k.last_used_at) : "—"}</td>
                    <td class="nowrap">
                      {(can.orgAdmin || (can.write && mine(k))) && k.enabled ? (
                        <ActionButton onClick={async () => (await post(`/keys/${seg(k.id)}/disable`), keys.reload())}>Disable</ActionButton>
                      ) : null}
                      {can.orgAdmin || (can.write && mine(k)) ? (
                        <ActionButton kind="danger" onClick={async () => (await del(`/keys/${seg(k.id)}`), keys.reload())}>
                          Delete
                        </ActionButton>
                      ) : null}
                    </td>
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

function Users() {
  const can = useAbilities();
  const [org, setOrg] = useState("");
  const users = useApi<Items<UserRow>>("/users", { org: org || undefined });
  const [form, setForm] = useState({ name: "", role: "member", org: "" });
  const [error, setError] = useState<string | null>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      await post("/users", { name: form.name.trim(), role: form.role as ApiRequest<"UserCreate">["role"], org: form.org.trim() || undefined } satisfies ApiRequest<"UserCreate">);
      setForm({ ...form, name: "" });
      users.reload();
    } catch (err) {
      setError(describe(err));
    }
  };
  return (
    <div class="stack">
      <Section title="Create a user" id="user-create">
        <form class="form-row" onSubmit={create}>
          <Field label="Name" hint="lowercase letters, digits and -">
            <input required value={form.name} onInput={(e) => setForm({ ...form, name: e.currentTarget.value })} data-testid="user-name" />
          </Field>
          <Field label="Role">
            <select value={form.role} onChange={(e) => setForm({ ...form, role: e.currentTarget.value })} data-testid="user-role">
              <option value="viewer">viewer</option>
              <option value="member">member</option>
              <option value="admin">admin</option>
            </select>
          </Field>
          {can.platformAdmin ? (
            <Field label="Organisation" hint="empty: yours">
              <input value={form.org} onInput={(e) => setForm({ ...form, org: e.currentTarget.value })} />
            </Field>
          ) : null}
          <button type="submit" class="btn btn-primary" data-testid="user-create-submit">
            Create user
          </button>
          {error ? (
            <div class="error" role="alert">
              {error}
            </div>
          ) : null}
        </form>
      </Section>
      <Section
        title="Users"
        id="users"
        actions={
          can.platformAdmin ? (
            <label class="field inline">
              <span class="label">Organisation</span>
              <input type="search" value={org} onChange={(e) => setOrg(e.currentTarget.value)} placeholder="all" />
            </label>
          ) : null
        }
      >
        <ErrorBox error={users.error} />
        {!users.data ? (
          <Loading />
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">User</th>
                  <th scope="col">Organisation</th>
                  <th scope="col">Role</th>
                  <th scope="col">State</th>
                  <th scope="col">Created</th>
                  <th scope="col">
                    <span class="sr-only">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {users.data.items.map((u) => (
                  <tr key={u.id} data-testid="user-row">
                    <td>
                      {u.name} <span class="mono muted small">{u.id}</span>
                    </td>
                    <td>{u.org_name}</td>
                    <td>
                      {u.role}
                      {u.platform_admin ? " · platform admin" : ""}
                    </td>
                    <td>{u.disabled ? "disabled" : "enabled"}</td>
                    <td>{time(u.created_at)}</td>
                    <td>
                      <ActionButton onClick={async () => (await post(`/users/${seg(u.id)}/${u.disabled ? "enable" : "disable"}`), users.reload())}>
                        {u.disabled ? "Enable" : "Disable"}
                      </ActionButton>
                    </td>
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

function Orgs() {
  const can = useAbilities();
  const orgs = useApi<Items<Org>>("/orgs");
  const [name, setName] = useState("");
  const [error, setError] = useState<string | null>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    setError(null);
    try {
      await post("/orgs", { name: name.trim() } satisfies ApiRequest<"OrgCreate">);
      setName("");
      orgs.reload();
    } catch (err) {
      setError(describe(err));
    }
  };
  return (
    <div class="stack">
      {can.platformAdmin ? (
        <Section title="Create an organisation" id="org-create">
          <form class="form-row" onSubmit={create}>
            <Field label="Name" hint="lowercase letters, digits and -">
              <input required value={name} onInput={(e) => setName(e.currentTarget.value)} data-testid="org-name" />
            </Field>
            <button type="submit" class="btn btn-primary">
              Create
            </button>
            {error ? (
              <div class="error" role="alert">
                {error}
              </div>
            ) : null}
          </form>
        </Section>
      ) : null}
      <Section title="Organisations" id="orgs">
        <ErrorBox error={orgs.error} />
        {!orgs.data ? (
          <Loading />
        ) : (
          <div class="table-wrap">
            <table>
              <thead>
                <tr>
                  <th scope="col">Organisation</th>
                  <th scope="col">Fair-share weight</th>
                  <th scope="col">Highest priority</th>
                  <th scope="col">Created</th>
                </tr>
              </thead>
              <tbody>
                {orgs.data.items.map((o) => (
                  <OrgRow key={o.id} org={o} editable={can.platformAdmin} onDone={orgs.reload} />
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Section>
    </div>
  );
}

function OrgRow({ org, editable, onDone }: { org: Org; editable: boolean; onDone: () => void }) {
  const [weight, setWeight] = useState(String(org.share_weight));
  const [priority, setPriority] = useState(org.max_priority);
  const changed = weight !== String(org.share_weight) || priority !== org.max_priority;
  return (
    <tr data-testid="org-row">
      <td>
        {org.name} <span class="mono muted small">{org.id}</span>
      </td>
      <td>
        {editable ? (
          <input type="number" min="0" step="0.1" value={weight} aria-label={`${org.name} fair-share weight`} onInput={(e) => setWeight(e.currentTarget.value)} style={{ width: "6em" }} />
        ) : (
          org.share_weight
        )}
      </td>
      <td>
        {editable ? (
          <select value={priority} aria-label={`${org.name} highest priority`} onChange={(e) => setPriority(e.currentTarget.value as Priority)}>
            {PRIORITIES.map((p) => (
              <option key={p}>{p}</option>
            ))}
          </select>
        ) : (
          org.max_priority
        )}{" "}
        {editable && changed ? (
          <ActionButton kind="primary" onClick={async () => (await patch(`/orgs/${seg(org.id)}`, { share_weight: Number(weight), max_priority: priority } satisfies ApiRequest<"OrgUpdate">), onDone())}>
            Save
          </ActionButton>
        ) : null}
      </td>
      <td>{time(org.created_at)}</td>
    </tr>
  );
}

const QUOTA_FIELDS = ["gpus", "cpus", "memory", "count", "storage"] as const;
const QUOTA_LABELS: Record<(typeof QUOTA_FIELDS)[number], [string, string?]> = {
  gpus: ["GPUs"],
  cpus: ["CPUs"],
  memory: ["Memory", "e.g. 128G"],
  count: ["Jobs at once"],
  storage: ["Storage", "e.g. 1T; category total only"],
};

function Quotas() {
  const can = useAbilities();
  const session = useSession();
  const orgs = useApi<Items<Org>>(can.platformAdmin ? "/orgs" : null);
  const [org, setOrg] = useState(session?.user.org_name ?? "");
  const report = useApi<QuotaReport>(can.platformAdmin ? `/orgs/${seg(org)}/quota` : "/quota");
  const [form, setForm] = useState<Record<string, string>>({ category: "train" });
  const [error, setError] = useState<string | null>(null);
  const save = async (e: Event) => {
    e.preventDefault();
    setError(null);
    const body: ApiRequest<"QuotaSet"> = { category: form.category as ApiRequest<"QuotaSet">["category"] };
    for (const f of QUOTA_FIELDS) {
      const text = (form[f] ?? "").trim();
      if (!text) continue;
      const value = f === "memory" || f === "storage" ? parseBytes(text) : Number(text);
      if (value === null || Number.isNaN(value) || (value as number) < 0) return setError(`${f}: not a quantity`);
      body[f] = value;
    }
    try {
      await put(`/orgs/${seg(org)}/quota`, body);
      report.reload();
    } catch (err) {
      setError(describe(err));
    }
    return undefined;
  };
  return (
    <div class="stack">
      {can.platformAdmin ? (
        <label class="field inline">
          <span class="label">Organisation</span>
          <select value={org} onChange={(e) => setOrg(e.currentTarget.value)} data-testid="quota-org">
            {(orgs.data?.items ?? [{ name: org, id: org } as Org]).map((o) => (
              <option key={o.id} value={o.name}>
                {o.name}
              </option>
            ))}
          </select>
        </label>
      ) : null}
      <Section title={report.data ? `Quota of ${report.data.org_name}` : "Quota"} id="quota-admin">
        <ErrorBox error={report.error} />
        {report.data ? <QuotaTable report={report.data} /> : <Loading />}
      </Section>
      {can.platformAdmin ? (
        <Section title="Set a limit" id="quota-set">
          <form class="form-row" onSubmit={save}>
            <Field label="Category">
              <select value={form.category} onChange={(e) => setForm({ ...form, category: e.currentTarget.value })}>
                {["train", "serve", "dev", "total"].map((c) => (
                  <option key={c}>{c}</option>
                ))}
              </select>
            </Field>
            {QUOTA_FIELDS.map((f) => (
              <Field key={f} label={QUOTA_LABELS[f][0]} hint={QUOTA_LABELS[f][1]}>
                <input value={form[f] ?? ""} onInput={(e) => setForm({ ...form, [f]: e.currentTarget.value })} style={{ width: "7em" }} />
              </Field>
            ))}
            <button type="submit" class="btn btn-primary">
              Set
            </button>
            {error ? (
              <div class="error" role="alert">
                {error}
              </div>
            ) : null}
          </form>
          <p class="muted small">Empty fields stay as they are.</p>
        </Section>
      ) : null}
    </div>
  );
}

function Audit() {
  const can = useAbilities();
  const [filters, setFilters] = useState({ since: "", until: "", user: "", action: "", org: "", outcome: "", limit: "100" });
  const [applied, setApplied] = useState(filters);
  const audit = useApi<Items<AuditRecord>>("/audit", {
    ...applied,
    since: applied.since ? new Date(applied.since).toISOString() : undefined,
    until: applied.until ? new Date(applied.until).toISOString() : undefined,
  });
  const set = (k: keyof typeof filters) => (e: Event) => setFilters({ ...filters, [k]: (e.currentTarget as HTMLInputElement).value });
  return (
    <div class="stack">
      <form
        class="card form-row"
        role="search"
        aria-label="Filter the audit trail"
        onSubmit={(e) => {
          e.preventDefault();
          setApplied(filters);
        }}
      >
        <Field label="Since">
          <input type="datetime-local" value={filters.since} onInput={set("since")} />
        </Field>
        <Field label="Until">
          <input type="datetime-local" value={filters.until} onInput={set("until")} />
        </Field>
        <Field label="User">
          <input value={filters.user} onInput={set("user")} data-testid="audit-user" />
        </Field>
        <Field label="Action" hint="part of it">
          <input value={filters.action} onInput={set("action")} data-testid="audit-action" />
        </Field>
        {can.platformAdmin ? (
          <Field label="Organisation">
            <input value={filters.org} onInput={set("org")} />
          </Field>
        ) : null}
        <Field label="Outcome">
          <select value={filters.outcome} onChange={set("outcome")}>
            {["", "success", "failed", "denied", "unauthenticated"].map((o) => (
              <option key={o} value={o}>
                {o || "any"}
              </option>
            ))}
          </select>
        </Field>
        <Field label="At most">
          <input type="number" min="1" max="1000" value={filters.limit} onInput={set("limit")} style={{ width: "6em" }} />
        </Field>
        <button type="submit" class="btn btn-primary" data-testid="audit-apply">
          Apply
        </button>
      </form>
      <ErrorBox error={audit.error} />
      {!audit.data ? (
        <Loading />
      ) : !audit.data.items.length ? (
        <Empty>No records match.</Empty>
      ) : (
        <div class="card table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Time</th>
                <th scope="col">Action</th>
                <th scope="col">Outcome</th>
                {can.platformAdmin ? <th scope="col">Organisation</th> : null}
                <th scope="col">User</th>
                <th scope="col">Key</th>
                <th scope="col">Resource</th>
                <th scope="col">Client</th>
                <th scope="col">Detail</th>
              </tr>
            </thead>
            <tbody>
              {audit.data.items.map((a) => (
                <tr key={a.id} data-testid="audit-row">
                  <td class="nowrap">{time(a.time)}</td>
                  <td>{a.action}</td>
                  <td>
                    {a.outcome} <span class="muted small">{a.status}</span>
                  </td>
                  {can.platformAdmin ? (
                    <td class="small" title={a.org_id ?? undefined} data-testid="audit-row-org">
                      {a.org_name ?? a.org_id ?? "—"}
                    </td>
                  ) : null}
                  <td class="small" title={a.user_id ?? undefined} data-testid="audit-row-user">
                    {a.user_name ?? a.user_id ?? "—"}
                  </td>
                  <td class="mono small">{a.key_id ?? "—"}</td>
                  <td class="small">{a.resource}</td>
                  <td class="small">{a.client}</td>
                  <td class="small">{a.detail}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}
