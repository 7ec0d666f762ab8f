// Who is signed in, kept in memory only: the session itself is the HttpOnly cookie the server set, and the CSRF
// token is read again from GET /api/v1/session when the page loads.

import { useEffect, useState } from "preact/hooks";
import { dropEarly } from "./early";
import type { SessionBody, User } from "./types";

let current: SessionBody | null = null;
const listeners = new Set<(s: SessionBody | null) => void>();

export function getSession(): SessionBody | null {
  return current;
}

export function setSession(session: SessionBody | null): void {
  if (!session) dropEarly(); // what the page asked before signing in, or with a session now gone: not to be reused
  current = session;
  listeners.forEach((fn) => fn(session));
}

export function useSession(): SessionBody | null {
  const [session, set] = useState(current);
  useEffect(() => {
    listeners.add(set);
    set(current);
    return () => void listeners.delete(set);
  }, []);
  return session;
}

/** What the signed-in user may do; the server checks the same and refuses the rest. */
export interface Abilities {
  write: boolean; // submit, cancel, rerun, stop, predict, manage its own keys
  orgAdmin: boolean; // users and keys of its organisation, its audit trail
  platformAdmin: boolean; // organisations, quotas, every organisation's audit trail
}

export function abilities(user: User | undefined | null): Abilities {
  const platformAdmin = Boolean(user?.platform_admin);
  const orgAdmin = platformAdmin || user?.role === "admin";
  return { write: orgAdmin || user?.role === "member", orgAdmin, platformAdmin };
}

export function useAbilities(): Abilities {
  return abilities(useSession()?.user);
}
