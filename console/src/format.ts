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

// The server's grammar for sizes (kiln.domain.quantities.parse_memory), character for character, so that a size
// typed here means what the same text means in a kiln.yaml or on the CLI: 2G, 2GB and 2Gi are all 2·1024³ bytes
// (as users mean it, and docker); k, m, g, t with an optional i and an optional b, in any case; a plain number is
// bytes. Its \s is Python's (what str.isspace() calls space), its \d any Unicode decimal digit (float() reads them).
// tests/e2e/test_console.py checks this against parse_memory over a table of texts.
const SPACE = "[\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const QUANTITY = new RegExp(`^${SPACE}*(\\p{Nd}+(?:\\.\\p{Nd}+)?)${SPACE}*([kmgt]i?)?b?${SPACE}*$`, "iu");
const POWERS: Record<string, number> = { k: 1, m: 2, g: 3, t: 4 };
const BLANK = new RegExp(`^${SPACE}*$`, "u");
const DIGIT = /\p{Nd}/u;

/** A decimal digit's value: Unicode encodes every set of decimal digits as one run, 0 to 9, so a digit is its
 * distance from the start of the runs of digits around it, modulo 10. */
function digitValue(char: string): string {
  const code = char.codePointAt(0)!;
  if (code < 128) return char;
  let start = code;
  while (DIGIT.test(String.fromCodePoint(start - 1))) start--;
  return String((code - start) % 10);
}

/** "2G", "512Mi", "1.5GB", "1073741824" → bytes, as the server reads them; null for empty; NaN when the server
 * would refuse the text as a quantity (or it is out of range). */
export function parseBytes(text: string): number | null {
  if (BLANK.test(text)) return null;
  const m = QUANTITY.exec(text);
  if (!m) return NaN;
  const number = Number(m[1].replace(/\p{Nd}/gu, digitValue));
  const unit = m[2] ? m[2][0].toLowerCase() : "";
  const bytes = Math.trunc(number * 1024 ** (POWERS[unit] ?? 0));
  return Number.isFinite(bytes) ? bytes : NaN;
}

export function commandText(command: string | string[]): string {
  if (typeof command === "string") return command;
  return command.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(" ");
}

/** A cost: two decimals (1,234.50), or two significant digits below 0.01 (0.0058, 0.000001), followed by its
 * currency where the server names one (KILN_CURRENCY: "1,234.50 EUR"). */
export function money(n: number | null | undefined, currency?: string | null): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  const unit = currency ? ` ${currency}` : "";
  const abs = Math.abs(n);
  if (abs < 1e-9 || abs >= 0.01) {
    return n.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + unit;
  }
  const digits = 1 - Math.floor(Math.log10(abs)); // two significant digits
  return n.toFixed(digits).replace(/0+$/, "") + unit;
}

/** Resource-seconds as hours: 1,234 above 100, three significant digits below (12.3, 0.00167). */
export function hours(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const h = seconds / 3600;
  if (Math.abs(h) >= 100) return Math.round(h).toLocaleString("en-US");
  return num(Number(h.toPrecision(3)));
}
