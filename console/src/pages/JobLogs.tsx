// A job's log, live: a running job's is followed with the chunked `?follow=true` stream (picked up again from
// the last byte on a dropped connection), a finished job's read in 1 MiB pages. Lines are
// `<time> <O|E|K>[@member] <text>` (stdout, stderr, Kiln's own; a gang member tags its lines): they can be
// searched and narrowed to one worker or stream. The newest MAX_LINES are kept, RENDER_LIMIT drawn.

import type { JSX } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ApiError, describe, send, seg, url } from "../api";
import { useDebounced } from "../hooks";
import { isActive, type Job } from "../types";

const MAX_LINES = 50_000;
const RENDER_LIMIT = 2_000;
const PAGE_BYTES = 1 << 20;
const AUTO_PAGES = 16; // a finished job: read up to 16 MiB at once, then on request

interface Line {
  n: number;
  time: string;
  stream: "O" | "E" | "K";
  worker: string | null;
  text: string;
}

const LINE = /^(\S+) ([OEK])(?:@(\S+))?(?: (.*))?$/s;
const STREAM_NAMES = { O: "stdout", E: "stderr", K: "kiln" } as const;

export function parseLine(raw: string, n: number): Line {
  const m = LINE.exec(raw);
  if (!m) return { n, time: "", stream: "O", worker: null, text: raw };
  return { n, time: m[1], stream: m[2] as Line["stream"], worker: m[3] ?? null, text: m[4] ?? "" };
}

type Status = "loading" | "following" | "reconnecting" | "ended" | "partial" | "error";

export function JobLogs({ job }: { job: Job }) {
  const lines = useRef<Line[]>([]);
  const dropped = useRef(0);
  const [version, setVersion] = useState(0);
  const [status, setStatus] = useState<Status>("loading");
  const [error, setError] = useState<unknown>(null);
  const [more, setMore] = useState<(() => void) | null>(null);
  const [search, setSearch] = useState("");
  const [worker, setWorker] = useState("all");
  const [stream, setStream] = useState("all");
  const [follow, setFollow] = useState(true);
  const [showTime, setShowTime] = useState(false);
  const box = useRef<HTMLDivElement>(null);
  const active = isActive(job.state);

  useEffect(() => {
    const abort = new AbortController();
    let offset = 0;
    let partial = "";
    let count = 0;
    let pending = false;
    const decoder = new TextDecoder();
    lines.current = [];
    dropped.current = 0;

    const flush = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        setVersion((v) => v + 1);
      });
    };
    const take = (bytes: Uint8Array, last = false) => {
      offset += bytes.byteLength;
      const text = partial + decoder.decode(bytes, { stream: !last });
      const parts = text.split("\n");
      partial = last ? "" : (parts.pop() ?? "");
      for (const raw of parts) if (raw) lines.current.push(parseLine(raw, count++));
      if (last && partial) lines.current.push(parseLine(partial, count++));
      if (lines.current.length > MAX_LINES) {
        const cut = lines.current.length - MAX_LINES;
        lines.current.splice(0, cut);
        dropped.current += cut;
      }
      flush();
    };
    const path = `/jobs/${seg(job.id)}/logs`;

    const readPages = async (pages: number) => {
      for (let i = 0; i < pages; i++) {
        const res = await send("GET", path, { query: { offset, limit: PAGE_BYTES }, signal: abort.signal });
        const body = new Uint8Array(await res.arrayBuffer());
        const next = Number(res.headers.get("X-Kiln-Next-Offset") ?? offset + body.byteLength);
        if (!body.byteLength) return true;
        take(body);
        offset = next;
        if (body.byteLength < PAGE_BYTES) return true;
      }
      return false;
    };

    const followStream = async () => {
      while (!abort.signal.aborted) {
        try {
          const res = await send("GET", path, { query: { follow: true, offset }, signal: abort.signal });
          setStatus("following");
          const reader = (res.body as ReadableStream<Uint8Array>).getReader();
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            take(value);
          }
          // The stream ends when the job does: read what may have been written after it closed.
          await readPages(AUTO_PAGES);
          setStatus("ended");
          return;
        } catch (err) {
          if (abort.signal.aborted) return;
          if (err instanceof ApiError && err.status !== 0 && err.status !== 429 && err.status < 500) {
            setError(err);
            setStatus("error");
            return;
          }
          setStatus("reconnecting");
          await new Promise((r) => setTimeout(r, 2000));
        }
      }
    };

    const readFinished = async () => {
      try {
        const complete = await readPages(AUTO_PAGES);
        if (partial) take(new Uint8Array(), true);
        setStatus(complete ? "ended" : "partial");
        setMore(() =>
          complete
            ? null
            : () => {
                setStatus("loading");
                void readFinished();
              },
        );
      } catch (err) {
        if (!abort.signal.aborted) {
          setError(err);
          setStatus("error");
        }
      }
    };

    if (active) void followStream();
    else void readFinished();
    return () => abort.abort();
    // A job that ends while followed is read to its end by the stream itself: no restart on that change.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [job.id]);

  const q = useDebounced(search, 150);
  const workers = useMemo(() => [...new Set(lines.current.map((l) => l.worker).filter((w): w is string => Boolean(w)))].sort(), [version]);
  const shown = useMemo(() => {
    const needle = q.toLowerCase();
    const out: Line[] = [];
    let total = 0;
    for (const l of lines.current) {
      if (worker !== "all" && l.worker !== worker) continue;
      if (stream !== "all" && l.stream !== stream) continue;
      if (needle && !l.text.toLowerCase().includes(needle)) continue;
      total++;
      out.push(l);
      if (out.length > RENDER_LIMIT) out.shift();
    }
    return { lines: out, total };
  }, [version, q, worker, stream]);

  useEffect(() => {
    if (follow && box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [shown, follow]);

  const onScroll = () => {
    const el = box.current;
    if (!el) return;
    const atBottom = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
    if (atBottom !== follow) setFollow(atBottom);
  };

  const statusText: Record<Status, string> = {
    loading: "Loading…",
    following: "Live: following the log",
    reconnecting: "Connection lost; reconnecting…",
    ended: active ? "Stream closed" : "Complete",
    partial: "Showing the first 16 MiB",
    error: "Cannot read the log",
  };

  return (
    <section class="card logs" aria-label="Log">
      <div class="log-tools" role="toolbar" aria-label="Log filters">
        <label class="field inline">
          <span class="label">Search</span>
          <input type="search" value={search} onInput={(e) => setSearch(e.currentTarget.value)} data-testid="log-search" />
        </label>
        <label class="field inline">
          <span class="label">Worker</span>
          <select value={worker} onChange={(e) => setWorker(e.currentTarget.value)} data-testid="log-worker">
            <option value="all">all</option>
            {workers.map((w) => (
              <option key={w} value={w}>
                {w}
              </option>
            ))}
          </select>
        </label>
        <label class="field inline">
          <span class="label">Stream</span>
          <select value={stream} onChange={(e) => setStream(e.currentTarget.value)} data-testid="log-stream">
            <option value="all">all</option>
            <option value="O">stdout</option>
            <option value="E">stderr</option>
            <option value="K">kiln</option>
          </select>
        </label>
        <label class="check">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.currentTarget.checked)} data-testid="log-follow" /> Scroll with new lines
        </label>
        <label class="check">
          <input type="checkbox" checked={showTime} onChange={(e) => setShowTime(e.currentTarget.checked)} /> Times
        </label>
        <a class="btn btn-plain" href={url(`/jobs/${seg(job.id)}/logs`, { limit: 16 << 20 })} download={`${job.id}.log`}>
          Download
        </a>
      </div>
      <div class="log-status muted small" aria-live="polite" data-testid="log-status" data-status={status}>
        {statusText[status]} · {shown.total.toLocaleString()} lines{q || worker !== "all" || stream !== "all" ? " match" : ""}
        {shown.total > shown.lines.length ? ` (the last ${shown.lines.length.toLocaleString()} shown)` : ""}
        {dropped.current ? ` · ${dropped.current.toLocaleString()} earlier lines not kept` : ""}
        {more ? (
          <button type="button" class="btn btn-plain" onClick={more}>
            Read more
          </button>
        ) : null}
      </div>
      {error ? (
        <div class="error" role="alert">
          {describe(error)}
        </div>
      ) : null}
      <div class="log-box" ref={box} onScroll={onScroll} tabIndex={0} aria-label="Log lines" data-testid="log-box">
        {shown.lines.map((l) => (
          <div key={l.n} class={`log-line s-${l.stream}`} data-testid="log-line" data-worker={l.worker ?? ""} data-stream={STREAM_NAMES[l.stream]}>
            {showTime ? <span class="lt">{l.time.replace("T", " ").replace(/\.\d+Z$/, "Z")} </span> : null}
            {l.worker ? <span class="lw">[{l.worker}] </span> : null}
            {l.stream === "K" ? <span class="lk">[kiln] </span> : null}
            <span class="lx">{highlight(l.text, q)}</span>
          </div>
        ))}
      </div>
    </section>
  );
}

function highlight(text: string, q: string) {
  if (!q) return text;
  const lower = text.toLowerCase();
  const needle = q.toLowerCase();
  const out: (string | JSX.Element)[] = [];
  let at = 0;
  for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, at)) {
    out.push(text.slice(at, i), <mark key={i}>{text.slice(i, i + needle.length)}</mark>);
    at = i + needle.length;
  }
  out.push(text.slice(at));
  return out;
}
