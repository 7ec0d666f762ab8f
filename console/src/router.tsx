// Client-side routing on the History API: the server answers index.html for every non-API path, so a deep link
// (/jobs/job-01…?tab=logs) loads the console straight onto that page.

import type { AnchorHTMLAttributes, ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";

export interface Location {
  path: string;
  query: URLSearchParams;
}

const listeners = new Set<() => void>();
const read = (): Location => ({ path: window.location.pathname, query: new URLSearchParams(window.location.search) });

window.addEventListener("popstate", () => listeners.forEach((fn) => fn()));

export function navigate(to: string, replace = false): void {
  if (to === window.location.pathname + window.location.search) return;
  window.history[replace ? "replaceState" : "pushState"](null, "", to);
  listeners.forEach((fn) => fn());
}

/** Change some query parameters of the current page (a tab, a filter), keeping the others. */
export function setQuery(changes: Record<string, string | null | undefined>, replace = true): void {
  const query = new URLSearchParams(window.location.search);
  for (const [key, value] of Object.entries(changes)) {
    if (value === null || value === undefined || value === "") query.delete(key);
    else query.set(key, value);
  }
  const text = query.toString();
  navigate(window.location.pathname + (text ? `?${text}` : ""), replace);
}

export function useLocation(): Location {
  const [location, set] = useState(read);
  useEffect(() => {
    const update = () => set(read());
    listeners.add(update);
    return () => void listeners.delete(update);
  }, []);
  return location;
}

/** "/jobs/:id" against "/jobs/job-01" → {id: "job-01"}; null when it does not match. */
export function match(pattern: string, path: string): Record<string, string> | null {
  const want = pattern.split("/").filter(Boolean);
  const have = path.split("/").filter(Boolean);
  if (want.length !== have.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    if (want[i].startsWith(":")) params[want[i].slice(1)] = decodeURIComponent(have[i]);
    else if (want[i] !== have[i]) return null;
  }
  return params;
}

type LinkProps = AnchorHTMLAttributes<HTMLAnchorElement> & { href: string; children?: ComponentChildren };

/** An <a> that navigates in place (a modified click, a middle click or "open in new tab" still work). */
export function Link({ href, children, ...rest }: LinkProps) {
  const onClick = (e: MouseEvent) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(href);
  };
  return (
    <a href={href} onClick={onClick} {...rest}>
      {children}
    </a>
  );
}
