// Small building blocks every page uses: state badges, errors, tabs, key/value lists, form fields, buttons that
// show they are busy and what went wrong.

import { cloneElement, isValidElement, type ButtonHTMLAttributes, type ComponentChildren, type VNode } from "preact";
import { useMemo, useState } from "preact/hooks";
import { describe } from "../api";
import { setQuery } from "../router";

const TONE: Record<string, string> = {
  QUEUED: "wait",
  WAITING: "wait",
  STARTING: "run",
  RUNNING: "run",
  RESTARTING: "warn",
  UPDATING: "run",
  DEPLOYING: "run",
  DRAINING: "warn",
  DEGRADED: "warn",
  SUCCEEDED: "ok",
  CACHED: "ok",
  READY: "ok",
  FAILED: "bad",
  PRUNED: "muted",
  SKIPPED: "muted",
  CANCELLED: "muted",
  STOPPED: "muted",
  IDLE: "muted",
  DELETING: "muted",
};

export function StateBadge({ state }: { state: string | null | undefined }) {
  const s = state ?? "—";
  return (
    <span class={`badge tone-${TONE[s] ?? "muted"}`} data-testid="state" data-state={s}>
      {s}
    </span>
  );
}

export function ErrorBox({ error, title }: { error: unknown; title?: string }) {
  if (!error) return null;
  return (
    <div class="error" role="alert" data-testid="error">
      {title ? <strong>{title}: </strong> : null}
      {describe(error)}
    </div>
  );
}

export function Loading({ what = "Loading" }: { what?: string }) {
  return (
    <p class="muted" aria-busy="true">
      {what}…
    </p>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="muted empty">{children}</p>;
}

export function Section({ title, actions, children, id }: { title: string; actions?: ComponentChildren; children: ComponentChildren; id?: string }) {
  return (
    <section class="card" aria-labelledby={id ? `${id}-title` : undefined} data-testid={id}>
      <header class="card-head">
        <h2 id={id ? `${id}-title` : undefined}>{title}</h2>
        {actions ? <div class="actions">{actions}</div> : null}
      </header>
      {children}
    </section>
  );
}

export function KeyValues({ rows }: { rows: [string, ComponentChildren][] }) {
  return (
    <dl class="kv">
      {rows.map(([k, v]) => (
        <div key={k}>
          <dt>{k}</dt>
          <dd>{v ?? "—"}</dd>
        </div>
      ))}
    </dl>
  );
}

export interface Tab {
  id: string;
  label: string;
}

/** Tabs kept in the URL (?tab=…), so a reload or a shared link opens the same one. */
export function Tabs({ tabs, current, param = "tab" }: { tabs: Tab[]; current: string; param?: string }) {
  const onKey = (e: KeyboardEvent) => {
    const i = tabs.findIndex((t) => t.id === current);
    const next = e.key === "ArrowRight" ? i + 1 : e.key === "ArrowLeft" ? i - 1 : null;
    if (next === null) return;
    e.preventDefault();
    const tab = tabs[(next + tabs.length) % tabs.length];
    setQuery({ [param]: tab.id });
    (document.getElementById(`tab-${tab.id}`) as HTMLElement | null)?.focus();
  };
  return (
    <div class="tabs" role="tablist" onKeyDown={onKey}>
      {tabs.map((t) => (
        <button
          key={t.id}
          id={`tab-${t.id}`}
          type="button"
          role="tab"
          aria-selected={t.id === current}
          tabIndex={t.id === current ? 0 : -1}
          data-testid={`tab-${t.id}`}
          onClick={() => setQuery({ [param]: t.id })}
        >
          {t.label}
        </button>
      ))}
    </div>
  );
}

type ButtonProps = Omit<ButtonHTMLAttributes<HTMLButtonElement>, "onClick"> & {
  onClick: () => Promise<unknown> | void;
  children: ComponentChildren;
  kind?: "primary" | "danger" | "plain";
};

/** A button for an action on the server: disabled while it runs, its error shown beside it. */
export function ActionButton({ onClick, children, kind = "plain", ...rest }: ButtonProps) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const run = async () => {
    setBusy(true);
    setError(null);
    try {
      await onClick();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <span class="action">
      <button type="button" class={`btn btn-${kind}`} disabled={busy} aria-busy={busy} onClick={run} {...rest}>
        {children}
      </button>
      {error ? (
        <span class="error inline" role="alert">
          {describe(error)}
        </span>
      ) : null}
    </span>
  );
}

let fieldIds = 0;

/** A labelled control: the label names it (and only the label: hints and problems are its description). */
export function Field({ label, hint, error, children, wide }: { label: string; hint?: string; error?: string | null; children: ComponentChildren; wide?: boolean }) {
  const id = useMemo(() => `field-${++fieldIds}`, []);
  const described = [hint ? `${id}-hint` : "", error ? `${id}-error` : ""].filter(Boolean).join(" ") || undefined;
  const control = isValidElement(children)
    ? cloneElement(children as VNode<Record<string, unknown>>, { id, "aria-describedby": described, ...(error ? { "aria-invalid": true } : {}) })
    : children;
  return (
    <div class={wide ? "field wide" : "field"}>
      <label class="label" for={id}>
        {label}
      </label>
      {control}
      {hint ? (
        <span class="hint" id={`${id}-hint`}>
          {hint}
        </span>
      ) : null}
      {error ? (
        <span class="error inline" id={`${id}-error`} role="alert">
          {error}
        </span>
      ) : null}
    </div>
  );
}

/** Used against a limit, as text and a bar; without a limit the text says so in words ("1 used, no limit": a bare
 * "1 (no limit)" read as a limit of 1) and there is no bar. */
export function Meter({ used, limit, format = String, label }: { used: number | null; limit: number | null; format?: (n: number) => string; label: string }) {
  const u = used ?? 0;
  const pct = limit ? Math.min(100, (u / limit) * 100) : 0;
  return (
    <div class="meter" data-testid="meter">
      <span>
        {limit !== null && limit !== undefined ? `${format(u)} / ${format(limit)}` : `${format(u)} used, no limit`}
      </span>
      {limit ? (
        <span class="bar" role="meter" aria-label={label} aria-valuemin={0} aria-valuemax={limit} aria-valuenow={u}>
          <span class={pct >= 100 ? "fill full" : "fill"} style={{ width: `${pct}%` }} />
        </span>
      ) : null}
    </div>
  );
}

export function Code({ children }: { children: string }) {
  return <pre class="code">{children}</pre>;
}
