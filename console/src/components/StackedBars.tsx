// A stacked bar chart in plain SVG: one bar per key (a day), each split into segments (a user's or a category's
// share), a value axis with round ticks, a legend with each series' total, and each bar's value and breakdown in
// its <title> (the browser's tooltip) and in a line under the chart as the pointer or the arrow keys move over it.
// Every bar is drawn, a zero one too (as an empty slot), so the axis is the whole window. A few dozen rectangles
// need no chart library.

import { useState } from "preact/hooks";
import { useWidth } from "../hooks";

export interface StackSeries {
  key: string;
  name: string;
  color: string;
}

export interface StackBar {
  key: string;
  label: string; // in its title and the readout (2026-12-10)
  tick: string; // under the axis (12-10)
  values: Record<string, number>; // by series key; a series it lacks is 0
}

interface Props {
  bars: StackBar[];
  series: StackSeries[]; // bottom to top, and the legend's order
  format: (n: number) => string;
  label: string; // what it shows, for its accessible name ("Cost per day by user")
  height?: number;
  testid?: string;
}

const MARGIN = { top: 10, right: 8, bottom: 26, left: 64 };
const TICK_SPACING = 56; // px between day labels, at least

/** A round step (1, 2, 2.5 or 5 times a power of ten) that splits ``max`` into about ``count`` intervals. */
export function niceStep(max: number, count = 4): number {
  if (!(max > 0)) return 1;
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * power;
}

/** A tick's text: as many decimals as the step needs (0.0025 → 0.0000, 0.0025, 0.0050…), two at least below 1. */
export function tickText(value: number, step: number): string {
  const decimals = step >= 1 && Number.isInteger(step) ? 0 : Math.max(2, (String(Number(step.toPrecision(3))).split(".")[1] ?? "").length);
  return value.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
}

const total = (bar: StackBar): number => Object.values(bar.values).reduce((a, b) => a + b, 0);

export function StackedBars({ bars, series, format, label, height = 240, testid = "stacked-bars" }: Props) {
  const [measure, width] = useWidth<HTMLDivElement>();
  const [active, setActive] = useState<number | null>(null);
  const totals = bars.map(total);
  const max = Math.max(0, ...totals);
  const step = niceStep(max);
  const top = max > 0 ? Math.ceil(max / step - 1e-9) * step : step;
  const ticks = Array.from({ length: Math.round(top / step) + 1 }, (_, i) => i * step);

  const plotW = Math.max(0, width - MARGIN.left - MARGIN.right);
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const slot = bars.length ? plotW / bars.length : 0;
  const barW = Math.max(1, Math.min(48, slot * 0.72));
  const y = (v: number) => MARGIN.top + plotH - (v / top) * plotH;
  const every = Math.max(1, Math.ceil(bars.length / Math.max(1, Math.floor(plotW / TICK_SPACING))));

  /** "2026-12-10: 0.42", then each series' share: a line each (the title), or after a dash (the readout). */
  const describe = (i: number, lines: boolean): string => {
    const bar = bars[i];
    const head = `${bar.label}: ${format(totals[i])}`;
    const parts = series.filter((s) => (bar.values[s.key] ?? 0) > 0).map((s) => `${s.name}: ${format(bar.values[s.key])}`);
    if (!parts.length) return head;
    return lines ? [head, ...parts].join("\n") : `${head} — ${parts.join("; ")}`;
  };
  const seriesTotal = (key: string) => bars.reduce((sum, b) => sum + (b.values[key] ?? 0), 0);
  const onKey = (e: KeyboardEvent) => {
    if (!bars.length) return;
    const now = active ?? bars.length - 1;
    const next = { ArrowLeft: now - 1, ArrowRight: now + 1, Home: 0, End: bars.length - 1 }[e.key];
    if (next === undefined) return;
    e.preventDefault();
    setActive(Math.max(0, Math.min(bars.length - 1, next)));
  };

  return (
    <div class="stacked" data-testid={testid} data-bars={bars.length} data-max={max}>
      <div ref={measure} class="stacked-plot">
        {width > 0 ? (
          <svg
            width={width}
            height={height}
            viewBox={`0 0 ${width} ${height}`}
            role="img"
            aria-label={`${label}: ${bars.length} bars, the highest ${format(max)}. Arrow keys step through them.`}
            tabIndex={0}
            onKeyDown={onKey}
            onFocus={() => setActive((a) => a ?? (bars.length ? bars.length - 1 : null))}
            onBlur={() => setActive(null)}
          >
            {ticks.map((v) => (
              <g key={v} class="stacked-tick">
                <line x1={MARGIN.left} x2={MARGIN.left + plotW} y1={y(v)} y2={y(v)} />
                <text x={MARGIN.left - 6} y={y(v)} dy="0.32em" text-anchor="end">
                  {tickText(v, step)}
                </text>
              </g>
            ))}
            {bars.map((bar, i) => {
              const x = MARGIN.left + i * slot;
              let base = 0;
              return (
                <g
                  key={bar.key}
                  class={active === i ? "stacked-bar active" : "stacked-bar"}
                  data-testid="stack-bar"
                  data-key={bar.key}
                  data-value={totals[i]}
                  onMouseEnter={() => setActive(i)}
                  onMouseLeave={() => setActive(null)}
                >
                  <title>{describe(i, true)}</title>
                  <rect class="stacked-hit" x={x} y={MARGIN.top} width={slot} height={plotH} />
                  {series.map((s) => {
                    const v = bar.values[s.key] ?? 0;
                    if (!(v > 0)) return null;
                    const y0 = y(base);
                    base += v;
                    const y1 = y(base);
                    return (
                      <rect
                        key={s.key}
                        data-testid="stack-segment"
                        data-series={s.key}
                        data-value={v}
                        x={x + (slot - barW) / 2}
                        y={Math.min(y1, y0 - 1)}
                        width={barW}
                        height={Math.max(1, y0 - y1)}
                        fill={s.color}
                      />
                    );
                  })}
                  {i % every === (bars.length - 1) % every ? (
                    <text class="stacked-label" x={x + slot / 2} y={MARGIN.top + plotH + 16} text-anchor="middle">
                      {bar.tick}
                    </text>
                  ) : null}
                </g>
              );
            })}
            <line class="stacked-axis" x1={MARGIN.left} x2={MARGIN.left + plotW} y1={y(0)} y2={y(0)} />
          </svg>
        ) : null}
      </div>
      <p class="stacked-readout small" aria-live="polite" data-testid="stack-readout">
        {active !== null && bars[active] ? describe(active, false) : "Point at a bar, or focus the chart and use the arrow keys, for its breakdown."}
      </p>
      {series.length ? (
        <ul class="stacked-legend" aria-label="Legend" data-testid="stack-legend">
          {series.map((s) => (
            <li key={s.key} data-series={s.key}>
              <span class="swatch" style={{ background: s.color }} aria-hidden="true" />
              {s.name} <span class="muted">{format(seriesTotal(s.key))}</span>
            </li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}
