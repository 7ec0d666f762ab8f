// Every call the console makes goes through here: same-origin /api/v1 with the session cookie (HttpOnly, set by
// POST /api/v1/session), the CSRF token as X-Kiln-CSRF on every request that changes something, and one place
// that turns a 401 into "sign in again" and an error body into a message a person can read.

import { takeEarly } from "./early";
import { getSession } from "./session";

export const API = "/api/v1";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: unknown,
  ) {
    super(message);
  }
}

let unauthorized: () => void = () => {};

/** What to do when the server says the session is gone (expired, signed out elsewhere, key disabled). */
export function onUnauthorized(handler: () => void): void {
  unauthorized = handler;
}

export type Query = Record<string, string | number | boolean | null | undefined | (string | number)[]>;

export function queryString(query?: Query): string {
  if (!query) return "";
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === null || value === undefined || value === "") continue;
    for (const v of Array.isArray(value) ? value : [value]) params.append(key, String(v));
  }
  const text = params.toString();
  return text ? `?${text}` : "";
}

export function url(path: string, query?: Query): string {
  return API + path + queryString(query);
}

/** A path segment (a job id, a file path's parts): encoded, with the slashes of a file path kept. */
export const seg = (value: string): string => encodeURIComponent(value);
export const filePath = (path: string): string => path.split("/").map(encodeURIComponent).join("/");

interface Options {
  query?: Query;
  body?: unknown;
  signal?: AbortSignal;
  /** false: a 401 is this call's answer (signing in), not a lost session. */
  session?: boolean;
}

function headers(method: string, json: boolean): Headers {
  const h = new Headers({ Accept: "application/json" });
  if (json) h.set("Content-Type", "application/json");
  const csrf = getSession()?.csrf_token;
  if (csrf && !["GET", "HEAD", "OPTIONS"].includes(method)) h.set("X-Kiln-CSRF", csrf);
  return h;
}

/** The raw fetch (for streams and text bodies); errors are thrown as ApiError like request()'s. */
export async function send(method: string, path: string, opts: Options = {}): Promise<Response> {
  const json = opts.body !== undefined;
  const target = url(path, opts.query);
  let response: Response;
  try {
    const taken = takeEarly(method, target);
    response = await (taken ??
      fetch(target, {
        method,
        headers: headers(method, json),
        body: json ? JSON.stringify(opts.body) : undefined,
        credentials: "same-origin",
        signal: opts.signal,
      }));
    if (taken && opts.signal?.aborted) throw new DOMException("the caller stopped waiting", "AbortError");
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, "network", "cannot reach the Kiln server (is it running?)");
  }
  if (!response.ok) throw await errorOf(response, opts.session !== false);
  return response;
}

export async function request<T>(method: string, path: string, opts: Options = {}): Promise<T> {
  const response = await send(method, path, opts);
  if (response.status === 204) return undefined as T;
  const type = response.headers.get("Content-Type") ?? "";
  return (type.includes("json") ? await response.json() : await response.text()) as T;
}

export const get = <T>(path: string, query?: Query, signal?: AbortSignal): Promise<T> =>
  request<T>("GET", path, { query, signal });
export const post = <T>(path: string, body?: unknown, query?: Query): Promise<T> =>
  request<T>("POST", path, { body: body ?? {}, query });
export const put = <T>(path: string, body: unknown): Promise<T> => request<T>("PUT", path, { body });
export const patch = <T>(path: string, body: unknown): Promise<T> => request<T>("PATCH", path, { body });
export const del = <T>(path: string): Promise<T> => request<T>("DELETE", path);

async function errorOf(response: Response, session: boolean): Promise<ApiError> {
  let body: { code?: string; message?: string; details?: unknown; detail?: unknown } = {};
  try {
    body = await response.json();
  } catch {
    /* not JSON: a proxy's page, say */
  }
  if (response.status === 401 && session) unauthorized();
  const message = body.message ?? (typeof body.detail === "string" ? body.detail : response.statusText);
  let text = message || `HTTP ${response.status}`;
  if (response.status === 429) {
    const after = response.headers.get("Retry-After");
    text += after ? ` (try again in ${after} s)` : "";
  }
  return new ApiError(response.status, body.code ?? String(response.status), text, body.details);
}

/** An error as one line, with each field a 422 names ("spec.resources.cpus: must be > 0"). */
export function describe(err: unknown): string {
  if (err instanceof ApiError) {
    // The server's message usually names the fields already; add those it does not.
    const fields = fieldErrors(err.details).filter((line) => !err.message.includes(line));
    return fields.length ? `${err.message}: ${fields.join("; ")}` : err.message;
  }
  return err instanceof Error ? err.message : String(err);
}

function fieldErrors(details: unknown): string[] {
  const list = Array.isArray(details)
    ? details
    : details && typeof details === "object" && Array.isArray((details as { errors?: unknown }).errors)
      ? (details as { errors: unknown[] }).errors
      : [];
  return list
    .map((d) => {
      if (!d || typeof d !== "object") return String(d);
      const item = d as { loc?: unknown[]; field?: string; msg?: string; message?: string };
      const where = item.field ?? (Array.isArray(item.loc) ? item.loc.filter((p) => p !== "body").join(".") : "");
      const what = item.msg ?? item.message ?? "";
      return where ? `${where}: ${what}` : what;
    })
    .filter((line) => line && !line.endsWith(": "));
}

/** A read of MLflow's tracking protocol that Kiln serves at /mlflow (runs and experiments: every job is a run),
 * with the session cookie; its errors ({error_code, message}) as ApiError. */
export async function tracking<T>(endpoint: string, query?: Query, signal?: AbortSignal): Promise<T> {
  const target = `/mlflow/api/2.0/mlflow/${endpoint}${queryString(query)}`;
  let response: Response;
  try {
    const taken = takeEarly("GET", target);
    response = await (taken ?? fetch(target, { headers: { Accept: "application/json" }, credentials: "same-origin", signal }));
    if (taken && signal?.aborted) throw new DOMException("the caller stopped waiting", "AbortError");
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, "network", "cannot reach the Kiln server (is it running?)");
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    if (response.status === 401) unauthorized();
    throw new ApiError(response.status, body.error_code ?? String(response.status), body.message ?? response.statusText);
  }
  return body as T;
}
