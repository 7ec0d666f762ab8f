// Numbers, sizes and times the way the CLI shows them.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return "—";
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(value < 10 ? 2 : 1)} ${UNITS[unit]}`;
}

/** 0.0123, 12345.7, 3e-05: six significant digits, no exponent for everyday magnitudes. */
export function num(n: number | string | null | undefined): string {
  if (n === null || n === undefined) return "—";
  if (typeof n === "string") return n;
  if (!Number.isFinite(n)) return String(n);
  if (Number.isInteger(n)) return String(n);
  const abs = Math.abs(n);
  if (abs !== 0 && (abs < 1e-4 || abs >= 1e15)) return n.toExponential(2).replace(/\.?0+e/, "e");
  return String(Number(n.toPrecision(6)));
}

export function cpus(n: number | null | undefined): string {
  return n === null || n === undefined ? "—" : String(Number(n.toFixed(2)));
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`;
}

export function since(iso: string | null | undefined, until?: string | null): string {
  if (!iso) return "—";
  const end = until ? Date.parse(until) : Date.now();
  return duration((end - Date.parse(iso)) / 1000);
}

export function ago(iso: string | null | undefined): string {
  if (!iso) return "—";
  const seconds = (Date.now() - Date.parse(iso)) / 1000;
  return seconds < 5 ? "just now" : `${duration(seconds)} ago`;
}

/** 2026-12-02 04:38:53 in the browser's time zone. */
export function time(iso: string | number | null | undefined): string {
  if (iso === null || iso === undefined) return "—";
  const d = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** "2G", "512Mi", "1.5GB", "1073741824" → bytes; null for empty; NaN when it cannot be read. */
export function parseBytes(text: string): number | null {
  const t = text.trim();
  if (!t) return null;
  const m = /^(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)b?$/i.exec(t);
  if (!m) return NaN;
  const power = "kmgtp".indexOf(m[2].toLowerCase()) + 1;
  const base = m[3] || power === 0 ? 1024 : 1000;
  return Math.round(Number(m[1]) * base ** power);
}

export function commandText(command: string | string[]): string {
  if (typeof command === "string") return command;
  return command.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(" ");
}
