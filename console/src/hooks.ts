import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError, get, type Query } from "./api";

export interface Loaded<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  reload: () => void;
}

export type Poll<T> = number | false | undefined | ((data: T | undefined) => number | false);

/** GET a path (null: nothing yet), again every `poll` ms while the tab is visible (a function of the last answer:
 * e.g. only while a job runs); the previous answer stays on screen while the next one loads, and a failed refresh
 * keeps it too (with the error beside it). */
export function useApi<T>(path: string | null, query?: Query, poll?: Poll<T>): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [loading, setLoading] = useState(Boolean(path));
  const [tick, setTick] = useState(0);
  const key = path === null ? null : path + JSON.stringify(query ?? {});
  const lastKey = useRef<string | null>(null);

  useEffect(() => {
    if (key === null || path === null) return undefined;
    if (lastKey.current !== key) {
      setData(undefined);
      lastKey.current = key;
    }
    const abort = new AbortController();
    let timer: number | undefined;
    let last: T | undefined;
    const interval = () => (typeof poll === "function" ? poll(last) : poll);
    const load = async () => {
      setLoading(true);
      try {
        last = await get<T>(path, query, abort.signal);
        setData(last);
        setError(undefined);
      } catch (err) {
        if (abort.signal.aborted) return;
        setError(err);
        setLoading(false);
        // Gone or not ours (404, 403): asking again will not change that.
        if (err instanceof ApiError && (err.status === 404 || err.status === 403)) return;
      }
      setLoading(false);
      const ms = interval();
      if (ms) timer = window.setTimeout(whenVisible, ms);
    };
    const whenVisible = () => {
      if (document.hidden) timer = window.setTimeout(whenVisible, 1000);
      else void load();
    };
    void load();
    return () => {
      abort.abort();
      window.clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key, tick, typeof poll === "function" ? "fn" : poll]);

  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, loading, reload };
}

/** The content width of an element, updated as it resizes. */
export function useWidth<E extends HTMLElement>(): [(el: E | null) => void, number] {
  const [width, setWidth] = useState(0);
  const observer = useRef<ResizeObserver | null>(null);
  const ref = useCallback((el: E | null) => {
    observer.current?.disconnect();
    if (!el) return;
    setWidth(el.clientWidth);
    observer.current = new ResizeObserver((entries) => setWidth(Math.floor(entries[0].contentRect.width)));
    observer.current.observe(el);
  }, []);
  return [ref, width];
}

/** A value that only changes once it has stayed the same for `ms`. */
export function useDebounced<T>(value: T, ms: number): T {
  const [settled, setSettled] = useState(value);
  useEffect(() => {
    const timer = window.setTimeout(() => setSettled(value), ms);
    return () => window.clearTimeout(timer);
  }, [value, ms]);
  return settled;
}

/** Run `fn` now and every `ms` while the page is visible, until unmounted or `ms` is falsy. */
export function useInterval(fn: () => void, ms: number | false): void {
  const saved = useRef(fn);
  saved.current = fn;
  useEffect(() => {
    if (!ms) return undefined;
    const timer = window.setInterval(() => {
      if (!document.hidden) saved.current();
    }, ms);
    return () => window.clearInterval(timer);
  }, [ms]);
}

/** Whether an element is in (or within `margin` of) the viewport, and whether it ever was. */
export function useVisible<E extends HTMLElement>(margin = "200px"): [(el: E | null) => void, boolean, boolean] {
  const [visible, setVisible] = useState(false);
  const [seen, setSeen] = useState(false);
  const observer = useRef<IntersectionObserver | null>(null);
  const ref = useCallback(
    (el: E | null) => {
      observer.current?.disconnect();
      if (!el) return;
      observer.current = new IntersectionObserver(
        (entries) => {
          const on = entries.some((e) => e.isIntersecting);
          setVisible(on);
          if (on) setSeen(true);
        },
        { rootMargin: margin },
      );
      observer.current.observe(el);
    },
    [margin],
  );
  useEffect(() => () => observer.current?.disconnect(), []);
  return [ref, visible, seen];
}
