// The answers public/early.js asked for while the bundle loaded (the session check; a job page's job and metric
// summary), taken once each by api.ts for the same GET, and all forgotten once the browser is signed out: they were
// asked without a session, or with one that is gone.

declare global {
  interface Window {
    /** The GETs public/early.js sent while the bundle loaded, by URL. */
    __kilnEarly?: Record<string, Promise<Response>>;
  }
}

/** The answer early.js already asked for, for the same GET (once: a later read asks the server again). */
export function takeEarly(method: string, target: string): Promise<Response> | undefined {
  const sent = window.__kilnEarly;
  if (method !== "GET" || !sent || !(target in sent)) return undefined;
  const answer = sent[target];
  delete sent[target];
  return answer;
}

export function dropEarly(): void {
  window.__kilnEarly = {};
}
