// The runs table as people read it: a run's state in Kiln's words, numbers rounded for display, the columns shown
// when none were asked for. The same rules as the CLI's (kiln.domain.run_table, where each is explained), checked
// against it under Node.js by tests/e2e/test_run_table_rules.py.

export interface KV {
  key: string;
  value: string;
}
export interface RunInfo {
  run_id: string;
  run_name: string;
  status: string;
  user_id: string;
  start_time?: number;
}
export interface Run {
  info: RunInfo;
  data: { params?: KV[]; tags?: KV[]; metrics?: { key: string; value: number }[] };
}

export const STATE_TAG = "kiln.state";
export const OBJECTIVE_TAG = "kiln.objective";
/** MLflow's status of a run logged from outside Kiln, in Kiln's words (a job's run has its job's state as a tag). */
const STATE_OF_STATUS: Record<string, string> = { SCHEDULED: "QUEUED", RUNNING: "RUNNING", FINISHED: "SUCCEEDED", FAILED: "FAILED", KILLED: "CANCELLED" };

const tag = (run: Run, key: string): string | undefined => run.data.tags?.find((t) => t.key === key)?.value;

/** What a person reads as the run's state: the server's kiln.state tag (PRUNED for a pruned trial), else its
 * MLflow status renamed. */
export function runState(run: Run): string {
  return tag(run, STATE_TAG) || STATE_OF_STATUS[run.info.status] || run.info.status;
}

const SIGNIFICANT = 4;
const NUMERIC = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

function trimmed(text: string): string {
  return text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
}

/** Four significant digits; whole from 1,000 to 10¹⁵; scientific below 0.0001 (1.201e-5). Halves away from zero
 * on the float's exact value (toExponential and toFixed do so; the CLI's Decimal does the same). */
export function formatNumber(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const sign = x < 0 ? "-" : "";
  const abs = Math.abs(x);
  if (abs >= 1000 && abs < 1e15) return sign + abs.toFixed(0);
  const [mantissa, exp] = abs.toExponential(SIGNIFICANT - 1).split("e");
  const digits = mantissa.replace(".", "");
  const exponent = Number(exp);
  if (exponent >= -4 && exponent < 15) {
    let text: string;
    if (exponent < 0) text = "0." + "0".repeat(-exponent - 1) + digits;
    else {
      const whole = digits.padEnd(exponent + 1, "0");
      text = whole.slice(0, exponent + 1) + "." + whole.slice(exponent + 1);
    }
    return sign + trimmed(text);
  }
  return `${sign}${trimmed(digits[0] + "." + digits.slice(1))}e${exponent > 0 ? "+" : "-"}${Math.abs(exponent)}`;
}

/** A cell: "-" for nothing, a number rounded, a param's numeric text rounded where it has more digits than four. */
export function formatValue(v: string | number | boolean | null | undefined): string {
  if (v === undefined || v === null) return "-";
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "number") return formatNumber(v);
  if (NUMERIC.test(v)) {
    const shown = formatNumber(Number(v));
    if (shown.length < v.length && Number(shown) !== Number(v)) return shown;
  }
  return v;
}

export function value(run: Run, column: string): string | number | undefined {
  const [kind, ...rest] = column.split(".");
  const key = rest.join(".");
  if (kind === "params") return run.data.params?.find((p) => p.key === key)?.value;
  if (kind === "metrics") return run.data.metrics?.find((m) => m.key === key)?.value;
  if (kind === "tags") return tag(run, key);
  return undefined;
}

/** The text shown beside the full value, for a cell's title: every digit, as the server sent it. */
export function fullValue(v: string | number | undefined): string | undefined {
  return v === undefined ? undefined : String(v);
}

function mostFirst(counts: Map<string, number>): string[] {
  return [...counts.keys()].sort((a, b) => counts.get(b)! - counts.get(a)! || (a < b ? -1 : a > b ? 1 : 0));
}

/** The study's objective, the params that differ between the runs (those most runs have first; where none
 * differs, those most runs have), the metrics most runs report. */
export function defaultColumns(runs: Run[], params = 4, metrics = 4): string[] {
  const objectives = new Map<string, number>();
  const having = new Map<string, number>();
  const values = new Map<string, Set<string>>();
  for (const run of runs) {
    const objective = tag(run, OBJECTIVE_TAG);
    if (objective) objectives.set(objective, (objectives.get(objective) ?? 0) + 1);
    for (const p of run.data.params ?? []) {
      having.set(p.key, (having.get(p.key) ?? 0) + 1);
      if (!values.has(p.key)) values.set(p.key, new Set());
      values.get(p.key)!.add(p.value);
    }
  }
  const objective = objectives.size ? mostFirst(objectives)[0] : undefined;
  const differ = new Map([...having].filter(([k]) => values.get(k)!.size > 1));
  const chosenParams = mostFirst(differ.size ? differ : having).slice(0, params);
  const reported = new Map<string, number>();
  for (const run of runs) {
    for (const m of run.data.metrics ?? []) {
      if (!m.key.includes("/") && m.key !== objective) reported.set(m.key, (reported.get(m.key) ?? 0) + 1);
    }
  }
  return [
    ...(objective ? [`metrics.${objective}`] : []),
    ...chosenParams.map((k) => `params.${k}`),
    ...mostFirst(reported).slice(0, metrics).map((k) => `metrics.${k}`),
  ];
}
